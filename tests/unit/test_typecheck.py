"""The static check of src/ (mypy, configured in pyproject.toml) passes, and it catches what it is
there for: an import of a name that does not exist (the verl launcher once imported a helper
from a module that no longer had it, and no test reached that line)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MYPY = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml")]


def _mypy(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([*MYPY, *args], cwd=cwd, capture_output=True, text=True, timeout=900)


def test_src_type_checks():
    proc = _mypy()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_the_check_catches_a_missing_import_inside_a_function(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def run(x):\n    from ragrl.stages.agent_rl import _prepare_work_dir\n    return _prepare_work_dir(x)\n")
    proc = _mypy(str(probe), cwd=tmp_path)
    assert proc.returncode != 0
    assert 'Module "ragrl.stages.agent_rl" has no attribute "_prepare_work_dir"' in proc.stdout


# A plug-in's hooks are checked against the Protocols that type `Method`'s fields
# (ragrl.methods) where `METHOD = Method(...)` passes them. The repo config disables arg-type for
# src/ as a whole (untyped library code), so this check turns it on for the plug-in files only
# (--follow-imports silent: errors in the modules they import are not theirs) and reads the
# errors of the Method(...) call, which are the hook mismatches.
PLUGINS = [*sorted((REPO / "src/ragrl/methods").glob("*.py")), *sorted((REPO / "tests/plugins").glob("*.py"))]
# Its own cache: other flags than test_src_type_checks, which would otherwise re-check every module.
HOOK_CACHE = REPO / ".mypy_cache" / "plugin_hooks"
WRONG_PLUGIN = '''
from ragrl.methods import Method, Score


def make_environment(recipe, backends):
    return None


def score(recipe, trajectory):  # no row
    return Score(0.0)


def gold_sft_reason(dataset: int) -> str | None:  # the dataset is a config mapping
    return None


def eval_rollout(cfg) -> str:  # must return the rollout settings
    return ""


METHOD = Method(name="wrong_hooks", summary="", make_environment=make_environment, score=score,
                gold_sft_reason=gold_sft_reason, eval_rollout=eval_rollout)
'''


def _hook_errors(*files: Path) -> tuple[subprocess.CompletedProcess, dict[str, list[str]]]:
    """mypy over plug-in files; {file name: its lines naming a Method hook argument}."""
    proc = _mypy("--enable-error-code", "arg-type", "--follow-imports", "silent", "--cache-dir", str(HOOK_CACHE),
                 *map(str, files))
    errors: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        if ": error:" in line and (' to "Method"' in line or 'of "Method"' in line):
            errors.setdefault(Path(line.split(":", 1)[0]).name, []).append(line)
    return proc, errors


def test_plugin_hooks_are_checked_against_their_protocols(tmp_path):
    wrong = tmp_path / "wrong_hooks.py"
    wrong.write_text(WRONG_PLUGIN)
    proc, errors = _hook_errors(*PLUGINS, wrong)
    assert proc.returncode in (0, 1), proc.stdout[-4000:] + proc.stderr[-2000:]  # 2: mypy itself failed
    # Every real plug-in's hooks fit: built in and the one loaded from outside src/.
    assert {name: lines for name, lines in errors.items() if name != wrong.name} == {}
    reported = "\n".join(errors.get(wrong.name, []))
    for hook in ("score", "gold_sft_reason", "eval_rollout"):
        assert f'Argument "{hook}" to "Method"' in reported, proc.stdout[-4000:]
    assert '"make_environment"' not in reported
