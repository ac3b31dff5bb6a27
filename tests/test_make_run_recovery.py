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

from test_workflow import REPO, TINY

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

    first = subprocess.Popen([str(bin_dir / "snakemake"), "--cores", "1", "--configfile=run.yaml", target],
                             cwd=repo, env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (repo / "logs/tiny_model.log").exists():
        assert first.poll() is None and time.monotonic() < deadline, "the first run ended before it could be killed"
        time.sleep(0.5)
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
