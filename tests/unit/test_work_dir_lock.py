"""One job per work directory (issue 34 F6): a resumable job locks its work directory for as long
as any of its processes holds the lock, so a second job on it fails at once, naming the directory
and the holder, whichever process of the first job was killed; and it runs once the holder died."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragrl import workdir

# A job that prepares its work dir, reports its pid, then works (sleeps) until killed. With an
# extra argument it hands the lock to a child (as the verl launcher does) and reports the child's pid.
JOB = """
import subprocess, sys, time
from ragrl import workdir
workdir.prepare_work_dir(sys.argv[1], {"lr": 1})
if len(sys.argv) > 2:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=workdir.held_fds(sys.argv[1]))
    print(child.pid, flush=True)
import os
print(os.getpid(), flush=True)
time.sleep(60)
"""


@pytest.fixture
def release(tmp_path):
    yield
    workdir.release_work_dir(tmp_path / "work")


def _dead(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
        except (OSError, IndexError):
            return
        if state == "Z":
            return
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} still runs")


def _second_job(work: Path, lr: int = 1) -> subprocess.CompletedProcess:
    code = f"from ragrl import workdir; workdir.prepare_work_dir({str(work)!r}, {{'lr': {lr}}})"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_second_job_fails_while_the_first_runs_after_its_wrapper_was_killed(tmp_path):
    work = tmp_path / "work"
    # `bash -c "python ..."` as Snakemake runs a job; `; true` keeps bash as the python's parent.
    cmd = f"{shlex.quote(sys.executable)} -c {shlex.quote(JOB)} {shlex.quote(str(work))}; true"
    wrapper = subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.PIPE, text=True, start_new_session=True)
    job = int(wrapper.stdout.readline())
    try:
        assert job != wrapper.pid
        (work / "checkpoints" / "step-2").mkdir(parents=True)
        wrapper.kill()  # SIGKILL of the wrapper alone: the python is re-parented and runs on
        wrapper.wait()
        for lr in (1, 2):  # the same job, and one that would move the work aside
            out = _second_job(work, lr)
            assert out.returncode != 0 and f"work directory {work} is in use" in out.stderr, out.stderr[-2000:]
            assert f"pid {job}:" in out.stderr, out.stderr[-2000:]
        assert (work / "checkpoints" / "step-2").is_dir()
        assert not any(p.name.startswith("superseded-") for p in work.iterdir())
    finally:
        os.kill(job, signal.SIGKILL)
    _dead(job)
    out = _second_job(work)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (work / "checkpoints" / "step-2").is_dir()


def test_a_child_given_the_lock_keeps_it_after_its_parent_is_killed(tmp_path):
    work = tmp_path / "work"
    proc = subprocess.Popen([sys.executable, "-c", JOB, str(work), "hand-on"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    child = int(proc.stdout.readline())
    parent = int(proc.stdout.readline())
    try:
        proc.kill()
        proc.wait()
        out = _second_job(work)
        assert out.returncode != 0 and f"pid {child}:" in out.stderr, out.stderr[-2000:]
    finally:
        os.kill(child, signal.SIGKILL)
    assert parent == proc.pid
    _dead(child)
    assert _second_job(work).returncode == 0


def test_the_lock_stays_in_place_when_work_is_moved_aside_and_back(tmp_path, release):
    work = tmp_path / "work"
    workdir.prepare_work_dir(work, {"lr": 1}, log=lambda _: None)
    (work / "checkpoints").mkdir()
    workdir.prepare_work_dir(work, {"lr": 2}, log=lambda _: None)  # this process holds it: no conflict
    aside = [p for p in work.iterdir() if p.name.startswith(workdir.SUPERSEDED)]
    assert (work / workdir.LOCK).is_file() and not (aside[0] / workdir.LOCK).exists()
    workdir.prepare_work_dir(work, {"lr": 1}, log=lambda _: None)
    assert (work / "checkpoints").is_dir() and (work / workdir.LOCK).is_file()
    assert workdir.held_fds(work)


def test_other_ranks_do_not_lock(tmp_path, monkeypatch):
    work = tmp_path / "work"
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(TimeoutError):
        workdir.prepare_work_dir(work, {"lr": 1}, wait_s=0.1)
    assert not workdir.held_fds(work)


def _busy_command(command: str, tmp_path: Path, work: Path) -> list[str]:
    # No model, passages or index exist: the lock is what stops the command.
    missing = [str(tmp_path / name) for name in ("p.parquet", "no-model", "no-index", "qa.parquet")]
    if command == "construct-kg":
        return ["construct-kg", "--passages", missing[0], "--model", missing[1], "--out", str(tmp_path / "kg"),
                "--work", str(work)]
    return ["harr-train", "--recipe", "{}", "--generator", missing[1], "--harr", "{}", "--index", missing[2],
            "--passages", missing[0], "--qa", missing[3], "--out-dir", str(work)]


@pytest.mark.parametrize("command", ["construct-kg", "harr-train"])
def test_a_busy_work_dir_fails_the_command_in_one_line_before_it_loads_a_model(tmp_path, command):
    work = tmp_path / "work"
    first = subprocess.Popen([sys.executable, "-c", JOB, str(work)], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    job = int(first.stdout.readline())
    try:
        out = subprocess.run([sys.executable, "-m", "ragrl", *_busy_command(command, tmp_path, work)],
                             capture_output=True, text=True, timeout=120)
    finally:
        first.kill()
        first.wait()
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.startswith(f"ragrl {command}: error: work directory {work} is in use by another job "
                                 f"(held by pid {job}:"), out.stderr[-2000:]
