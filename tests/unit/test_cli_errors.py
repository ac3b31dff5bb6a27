"""The CLI's error policy (ragrl.cli.main): a RagrlError (or a missing input file) is one line
`ragrl <cmd>: error: <msg>` and exit 2; `--debug` or RAGRL_DEBUG=1 adds its traceback; any other
exception is a bug and propagates with its traceback. And every sub-command still parses."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ragrl.cli.models
from ragrl.cli import build_parser, main
from ragrl.errors import InputError, RagrlError

SRC = str(Path(__file__).resolve().parents[2] / "src")
# A user error that costs nothing: the world generator refuses a world too small for its questions.
TOO_SMALL = ["world", "--seed", "1", "--size", "5", "--out"]
MESSAGE = "ragrl world: error: world size 5: at least 20 people are needed for every question type"


@pytest.fixture(autouse=True)
def _no_debug_env(monkeypatch):
    monkeypatch.delenv("RAGRL_DEBUG", raising=False)


def test_a_user_error_is_one_line_and_exit_2(tmp_path, capsys):
    assert main([*TOO_SMALL, str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == MESSAGE and "Traceback" not in err
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_adds_the_traceback(tmp_path, capsys, monkeypatch, how):
    argv = [*TOO_SMALL, str(tmp_path / "w")]
    if how == "flag":
        argv = ["--debug", *argv]
    else:
        monkeypatch.setenv("RAGRL_DEBUG", "1")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "InputError: world size 5" in err and err.rstrip().endswith(MESSAGE)


def test_debug_env_off_values(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RAGRL_DEBUG", "0")
    assert main([*TOO_SMALL, str(tmp_path / "w")]) == 2
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("exc", [ValueError("a library bug"), KeyError("x"), ImportError("no module named y")])
def test_any_other_exception_is_a_bug_and_keeps_its_traceback(tmp_path, monkeypatch, exc):
    def fail(args):
        raise exc

    monkeypatch.setattr(ragrl.cli.models, "_cmd_world", fail)
    with pytest.raises(type(exc)):
        main(["world", "--seed", "1", "--out", str(tmp_path / "w")])


@pytest.mark.parametrize("exc", [InputError("bad value"), RagrlError("busy"),
                                 FileNotFoundError(2, "No such file or directory", "in.parquet")])
def test_user_errors_and_missing_files_are_one_line(tmp_path, monkeypatch, capsys, exc):
    def fail(args):
        raise exc

    monkeypatch.setattr(ragrl.cli.models, "_cmd_world", fail)
    assert main(["world", "--seed", "1", "--out", str(tmp_path / "w")]) == 2
    assert capsys.readouterr().err == f"ragrl world: error: {exc}\n"


def test_the_user_facing_classes_are_ragrl_errors_with_their_old_bases():
    from ragrl.factscore.paper import EndpointError, EndpointUnavailable
    from ragrl.models import ModelNameError
    from ragrl.rewards.autograph import JudgeError
    from ragrl.workdir import WorkDirBusy

    for cls in (WorkDirBusy, EndpointError, EndpointUnavailable, JudgeError):
        assert issubclass(cls, RagrlError) and issubclass(cls, RuntimeError), cls
    assert issubclass(ModelNameError, InputError) and issubclass(InputError, ValueError)


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _commands(sub, (*prefix, name))


COMMANDS = list(_commands(build_parser()))


def test_the_command_table_is_complete():
    # The rules call these by name; a group module that stopped registering would drop some.
    assert len(COMMANDS) == 37 and ("model", "check") in COMMANDS and ("retrieval", "service-check") in COMMANDS


@pytest.mark.parametrize("command", [(), *COMMANDS], ids=lambda c: " ".join(c) or "ragrl")
def test_every_command_parses_its_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*command, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: ragrl {' '.join(command)}".rstrip())


def test_python_dash_m_gives_one_line_and_ragrl_debug_the_traceback(tmp_path):
    argv = [sys.executable, "-m", "ragrl", *TOO_SMALL, str(tmp_path / "w")]
    env = dict(os.environ, PYTHONPATH=SRC)
    env.pop("RAGRL_DEBUG", None)
    plain = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert plain.returncode == 2 and plain.stderr.strip() == MESSAGE
    debug = subprocess.run(argv, capture_output=True, text=True, env={**env, "RAGRL_DEBUG": "1"})
    assert debug.returncode == 2 and "Traceback" in debug.stderr and debug.stderr.rstrip().endswith(MESSAGE)


def test_construct_kg_takes_a_bare_system_prompt_flag():
    # rules/construct_kg.smk passes --system-prompt {params.system:q}; Snakemake quotes an empty
    # string as nothing, so the default run's command ends in a bare flag.
    from ragrl.cli import build_parser

    base = ["construct-kg", "--passages", "p", "--model", "m", "--out", "o", "--work", "w"]
    assert build_parser().parse_args([*base, "--system-prompt"]).system_prompt == ""
    assert build_parser().parse_args(base).system_prompt == ""
    assert build_parser().parse_args([*base, "--system-prompt", "Be brief.\nJSON."]).system_prompt == "Be brief.\nJSON."
