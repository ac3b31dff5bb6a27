"""`make run` after a kill -9 (issue 18 F11): the documented route recovers by itself, and the
stale-lock cleanup never takes a lock from a snakemake (or its jobs) still running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import REPO, TINY

SCRIPT = REPO / "scripts/unlock_stale.sh"


def _locked_dir(tmp_path: Path) -> Path:
    (tmp_path / ".snakemake/locks").mkdir(parents=True)
    (tmp_path / ".snakemake/locks/0.output.lock").write_text("results/x\n")
    return tmp_path


def _process(cwd: Path, argv0: str) -> subprocess.Popen:
    # A process that looks like `argv0` in /proc/PID/cmdline, running in `cwd`.
    return subprocess.Popen(["bash", "-c", f'exec -a "{argv0}" sleep 60'], cwd=cwd)


@pytest.mark.parametrize("argv0", ["snakemake", "/bin/bash -c set -euo pipefail; python -m ragrl rl"])
def test_lock_stays_while_snakemake_or_its_jobs_run(tmp_path, argv0):
    work = _locked_dir(tmp_path)
    proc = _process(work, argv0)
    try:
        time.sleep(0.3)
        out = subprocess.run(["bash", str(SCRIPT)], cwd=work, capture_output=True, text=True)
    finally:
        proc.kill()
        proc.wait()
    assert out.returncode == 1 and str(proc.pid) in out.stderr
    assert (work / ".snakemake/locks/0.output.lock").exists()


def test_no_lock_is_nothing_to_do(tmp_path):
    out = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == ""


def _fake_ragrl(checkout: Path) -> None:
    # `python -m ragrl ...` run in `checkout` finds this package first (the working directory
    # leads sys.path): it reports its pid and works until told to stop, like a long job.
    (checkout / "ragrl").mkdir()
    (checkout / "ragrl/__init__.py").write_text("")
    (checkout / "ragrl/__main__.py").write_text(
        "import os, pathlib, time\n"
        "pathlib.Path('.job.pid.tmp').write_text(str(os.getpid()))\n"
        "os.replace('.job.pid.tmp', 'job.pid')\n"
        "deadline = time.monotonic() + 60\n"
        "while not pathlib.Path('job.stop').exists() and time.monotonic() < deadline:\n"
        "    time.sleep(0.02)\n")


def _wait_for(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def test_orphan_of_a_killed_job_wrapper_blocks_the_next_run(tmp_path):
    """Issue 34 F6: `kill -9` of a job's `bash -c` wrapper leaves its python running, and snakemake
    exits as after any failed job, with no lock. The next run must still see the orphan."""
    _fake_ragrl(tmp_path)
    # As Snakemake runs a job; `; true` keeps bash as the python's parent.
    wrapper = subprocess.Popen(["bash", "-c", f"set -euo pipefail; {sys.executable} -m ragrl construct-kg --work w; true"],
                               cwd=tmp_path, start_new_session=True)
    _wait_for(lambda: (tmp_path / "job.pid").exists(), "the job did not start")
    job = int((tmp_path / "job.pid").read_text())
    try:
        assert job != wrapper.pid
        wrapper.kill()  # SIGKILL to the wrapper alone
        wrapper.wait()
        assert _running(job) and not (tmp_path / ".snakemake").exists()
        out = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True)
        assert out.returncode == 1 and f"{job}: " in out.stderr and "-m ragrl construct-kg" in out.stderr, out
        (tmp_path / "job.stop").touch()
        _wait_for(lambda: not _running(job), "the job did not stop")
    finally:
        if _running(job):
            os.kill(job, signal.SIGKILL)
    out = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "" and out.stderr == "", out


def test_jobs_of_a_live_snakemake_without_a_lock_are_left_alone(tmp_path):
    # A snakemake running here with no lock (--nolock, a dry run) owns its jobs: they are no orphans.
    _fake_ragrl(tmp_path)
    snakemake = subprocess.Popen(["bash", "-c", f'exec -a snakemake bash -c "{sys.executable} -m ragrl rl; true"'],
                                 cwd=tmp_path, start_new_session=True)
    try:
        _wait_for(lambda: (tmp_path / "job.pid").exists(), "the job did not start")
        out = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True)
    finally:
        os.killpg(snakemake.pid, signal.SIGKILL)
        snakemake.wait()
    assert out.returncode == 0, out


@pytest.mark.integration
def test_make_run_recovers_after_kill_9(tmp_path):
    repo = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in files.decode().split("\0"):
        if rel and (REPO / rel).is_file() and not rel.startswith("tests/"):
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / rel).write_bytes((REPO / rel).read_bytes())
    (repo / "run.yaml").write_text(yaml.safe_dump(TINY))
    target = "results/models/tiny/config.json"
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, HF_HUB_OFFLINE="1", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    # Its own process, not a fork of `make test`'s fork server: the job must live long enough to be killed.
    env.pop("RAGRL_FORKSERVER", None)

    first = subprocess.Popen([str(bin_dir / "snakemake"), "--cores", "1", "--configfile=run.yaml", target],
                             cwd=repo, env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # The job's log can appear before Snakemake writes its incomplete marker: wait for both, so the
    # kill lands inside the job as a node loss does.
    incomplete = repo / ".snakemake/incomplete"

    def job_started() -> bool:
        return (repo / "logs/tiny_model.log").exists() and incomplete.is_dir() and bool(os.listdir(incomplete))

    _wait_for(lambda: job_started() or first.poll() is not None, "the job did not start within 300 s", timeout=300)
    assert first.poll() is None, "the first run ended before it could be killed"
    os.killpg(first.pid, signal.SIGKILL)  # snakemake and its job, as a node loss or OOM kill does
    first.wait()
    assert os.listdir(repo / ".snakemake/locks") and os.listdir(repo / ".snakemake/incomplete")

    venv = Path(sys.prefix)
    out = subprocess.run(["make", "-o", f"{venv}/.ragrl-installed", "run", f"VENV={venv}", "CORES=1",
                          f"RUN_ARGS=--configfile=run.yaml {target}"],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "Removing a stale Snakemake lock" in out.stdout
    assert (repo / target).is_file() and (repo / "results/models/tiny/model.safetensors").is_file()
