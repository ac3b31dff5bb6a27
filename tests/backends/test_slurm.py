"""The workflow through a real SLURM cluster: slurmctld + slurmd on this machine, the Snakemake
SLURM executor submitting every job with sbatch (profiles/slurm-local).

The module fixture installs and starts the cluster with scripts/slurm_local.sh (Debian packages,
one node, 2 fake GPUs) and stops it, by the pids the script recorded, when the module is done.
Needs root and apt-get (CI runs as root on Debian); anywhere else the cluster tests skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from ragrl.serving import log_tail
from helpers import REPO, TINY, run_snakemake

SCRIPT = REPO / "scripts/slurm_local.sh"
PROFILE = REPO / "profiles/slurm-local"


def _cluster_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root: scripts/slurm_local.sh installs Debian packages and starts slurmctld/slurmd"
    if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        return "needs Debian/Ubuntu (apt-get) to install munge and SLURM"
    return None


@pytest.fixture(scope="module")
def cluster(without_stub_slurm_conf):
    reason = _cluster_unavailable()
    if reason:
        pytest.skip(reason)
    was_running = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True).returncode == 0
    start = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=900)
    assert start.returncode == 0, start.stdout + start.stderr
    yield
    # A cluster someone started before the tests is theirs; one the fixture started is stopped.
    if not was_running:
        stop = subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr


def _jobs() -> list[dict]:
    """Every job slurmctld still knows (finished ones stay for MinJobAge=600 s), as
    `scontrol show job` fields: JobId, Comment (rule_<name>_wildcards_...), JobState, TimeLimit,
    Partition, JOB_GRES (the GPUs allocated, with -d)."""
    out = subprocess.run(["scontrol", "-d", "-o", "show", "job"], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    jobs = []
    for line in out.splitlines():
        if line.startswith("JobId="):
            jobs.append(dict(f.split("=", 1) for f in line.split() if "=" in f))
    return jobs


def _max_job_id() -> int:
    return max((int(j["JobId"]) for j in _jobs()), default=0)


def _rule(job: dict) -> str:
    """The Snakemake rule of a job ("" for a job Snakemake did not submit)."""
    m = re.match(r"rule_([a-z0-9_]+?)(?:_wildcards_.*)?$", job.get("Comment", ""))
    return m.group(1) if m else ""


def _real_profile_default_resources() -> list[str]:
    """profiles/slurm's account/partition lines, as its profile loader turns them into arguments."""
    profile = yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())
    return [f"{k}={v}" for k, v in profile["default-resources"].items()]


def _cluster_report(workdir: Path, output: str, live: list[dict]) -> str:
    """What a hung SLURM run looks like from outside: the queue, the node, the daemons' logs, the
    plugin's status-query lines and the logs of the jobs still queued or running (`live`). CI
    shows nothing else of it."""
    def run(*cmd: str) -> str:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            return done.stdout + done.stderr
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"({' '.join(cmd)}: {e})"

    state = Path(os.environ.get("RAGRL_SLURM_STATE", "/var/lib/ragrl-slurm"))
    status_lines = [line for line in output.splitlines()
                    if re.search(r"status|sacct|squeue|Falling back|SLURM query", line, re.I)]
    parts = [
        "squeue:\n" + run("squeue", "--states=all", "-o", "%i %T %M %l %R %k"),
        "sinfo:\n" + run("sinfo", "-N", "-o", "%N %T %E"),
        "slurmctld.log:\n" + log_tail(state / "log/slurmctld.log", 25),
        "slurmd.log:\n" + log_tail(state / "log/slurmd.log", 25),
        "plugin status lines:\n" + "\n".join(status_lines[-30:]),
    ]
    for job in live:
        for log in (workdir / "logs/slurm").rglob(f"{job['JobId']}.log"):
            parts.append(f"{log}:\n" + log_tail(log, 25))
    parts.append("snakemake output:\n" + output[-4000:])
    return "\n\n".join(parts)


def _slurm_snakemake(workdir: Path, config: dict, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """Snakemake through the local cluster; a run past `timeout` (a hang: each run here takes
    minutes) fails the test with `_cluster_report` and its jobs cancelled."""
    # The plugin puts a relative slurm-logdir under the directory snakemake was started from,
    # not under --directory; an absolute one keeps the test's SLURM logs in its temp dir.
    # --verbose: the plugin logs its status queries (and their failures) only at debug level.
    first_id = _max_job_id()
    try:
        return run_snakemake(workdir, config, "--profile", str(PROFILE), "--slurm-logdir", str(workdir / "logs/slurm"),
                          "--verbose", *args, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        output = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                         for x in (e.stdout, e.stderr))
        try:
            live = [j for j in _jobs() if j.get("JobState") in ("RUNNING", "PENDING")]
            note = ""
        except (OSError, subprocess.SubprocessError) as err:  # a controller that does not answer is a finding too
            live, note = [], f"\n\n(scontrol show job: {err})"
        report = _cluster_report(workdir, output, live) + note
        # The killed Snakemake could not cancel its jobs: free the node for the module's next test.
        left = [j["JobId"] for j in live if int(j["JobId"]) > first_id]
        if left:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["scancel", *left], capture_output=True, timeout=60)
        pytest.fail(f"snakemake did not finish in {timeout:.0f} s\n\n{report}", pytrace=False)


def _minutes(limit: str) -> int:
    """A SLURM time limit ([D-]HH:MM:SS) in minutes."""
    days, _, hms = limit.rpartition("-")
    hours, minutes, _ = (int(p) for p in hms.split(":"))
    return int(days or 0) * 1440 + hours * 60 + minutes


class _CancelFirstAttempt(threading.Thread):
    """Cancel (scancel) the first job of one rule once it runs: SLURM kills it mid-run."""

    def __init__(self, rule: str, after_id: int):
        super().__init__(daemon=True)
        self.rule, self.after_id = rule, after_id
        self.cancelled: str | None = None
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set() and self.cancelled is None:
            for job in _jobs():
                if int(job["JobId"]) > self.after_id and _rule(job) == self.rule and job["JobState"] == "RUNNING":
                    subprocess.run(["scancel", job["JobId"]], check=True)
                    self.cancelled = job["JobId"]
                    return
            time.sleep(0.2)


@pytest.mark.integration
def test_dag_runs_through_slurm(cluster, tmp_path, monkeypatch):
    config = json.loads(json.dumps(TINY))
    # The cheapest job asks for a GPU of a named model: sbatch --gpus=a100:1.
    config["resources"]["rules"]["policy_generate"] = {"gpu": 1, "gpu_model": "a100"}
    # The killed job's retry asks for twice its 30 minutes, capped at 50.
    config["resources"]["rules"]["embed_shard"].update(runtime=30, max_runtime=50)
    corpus = config["retrieval"]["corpus"]
    targets = ["results/tables/retrieval_recall.md", "results/checks/policy_generate.txt",
               *[f"results/corpus/{name}/passages.parquet" for name in config["corpora"]]]
    # Partition from the environment exactly as the real-cluster profile does it; `gpu` is the
    # local cluster's non-default partition, so a job lands there only if the value got through.
    monkeypatch.setenv("SLURM_PARTITION", "gpu")
    monkeypatch.setenv("SLURM_ACCOUNT", "")
    # On a cluster each job is its own process under slurmd (no fork server: make test's would
    # be reachable here through sbatch --export=ALL).
    monkeypatch.delenv("RAGRL_FORKSERVER", raising=False)
    first_id = _max_job_id()
    killer = _CancelFirstAttempt("embed_shard", first_id)
    killer.start()
    started = time.monotonic()
    try:
        # Targets first: --default-resources takes every argument up to the next option.
        proc = _slurm_snakemake(tmp_path, config, *targets, "--default-resources", *_real_profile_default_resources())
    finally:
        killer.stop.set()
    wall = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    print(f"SLURM DAG run: {wall:.0f} s")

    jobs = [j for j in _jobs() if int(j["JobId"]) > first_id]
    # Every job of the DAG went through sbatch (nothing ran locally), in the partition asked for.
    assert {"world", "tiny_model", "policy_generate", "corpus", "embed_shard", "index", "bm25",
            "retrieval_eval", "retrieval_table"} <= {_rule(j) for j in jobs}, jobs
    assert {j["Partition"] for j in jobs} == {"gpu"}

    # The GPU rule got one of the node's GPUs, and the job saw it; no other job got one.
    gpu_jobs = [j for j in jobs if _rule(j) == "policy_generate"]
    assert [(j["JobState"], j["JOB_GRES"]) for j in gpu_jobs] == [("COMPLETED", "gpu:a100:1")], gpu_jobs
    assert {j["JOB_GRES"] for j in jobs if _rule(j) != "policy_generate"} == {"(null)"}
    log = (tmp_path / "logs/policy_generate.log").read_text()
    assert re.search(r"^CUDA_VISIBLE_DEVICES=[01]$", log, re.M), log
    assert (tmp_path / "results/checks/policy_generate.txt").read_text().strip()
    slurm_log = tmp_path / f"logs/slurm/rule_policy_generate/{gpu_jobs[0]['JobId']}.log"
    assert slurm_log.is_file(), sorted((tmp_path / "logs/slurm").rglob("*"))

    # The job SLURM killed was resubmitted (profile retries) with a longer time limit.
    assert killer.cancelled is not None, "the embed_shard job finished before it could be cancelled"
    cancelled = next(j for j in jobs if j["JobId"] == killer.cancelled)
    assert cancelled["JobState"] == "CANCELLED", cancelled
    retried = [j for j in jobs if j["Comment"] == cancelled["Comment"] and int(j["JobId"]) > int(killer.cancelled)]
    assert [j["JobState"] for j in retried] == ["COMPLETED"], retried
    assert (_minutes(cancelled["TimeLimit"]), _minutes(retried[0]["TimeLimit"])) == (30, 50), (cancelled, retried)

    # What the DAG computed through SLURM is the real thing, not empty files.
    import csv

    rows = list(csv.DictReader((tmp_path / "results/tables/retrieval_recall.csv").open()))
    assert {r["retriever"] for r in rows} == {"flat", "bm25", "hybrid"}
    assert (tmp_path / f"results/embeddings/{corpus}/shard-0-of-2.npy").stat().st_size > 0


@pytest.mark.integration
def test_gpu_request_beyond_the_partition_fails_at_submission(cluster, tmp_path):
    config = json.loads(json.dumps(TINY))
    config["resources"]["rules"]["world"] = {"gpu": 8}  # the node has 2
    started = time.monotonic()
    proc = _slurm_snakemake(tmp_path, config, "--retries", "0", "results/world/passages.parquet")
    wall = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Requested node configuration is not available" in output, output[-4000:]
    assert "--gpus=8" in output, output[-4000:]  # the sbatch line is in the message
    assert wall < 120, f"a request SLURM cannot satisfy should fail at sbatch, not after {wall:.0f} s"
    assert not (tmp_path / "results/world/passages.parquet").exists()


FLAKY_SQUEUE = """#!/bin/sh
# squeue that fails the plugin's status query (`squeue ... --name <run>`) for $FAIL_S seconds from
# the first such query, as a controller too busy to answer does, then is the real one.
case " $* " in
  *" --name "*)
    now=$(date +%s)
    [ -s "$STATE_DIR/first" ] || echo "$now" > "$STATE_DIR/first"
    if [ $((now - $(cat "$STATE_DIR/first"))) -lt "$FAIL_S" ]; then
      echo x >> "$STATE_DIR/failures"
      echo "slurm_load_jobs error: Socket timed out on send/recv operation" >&2
      exit 1
    fi ;;
esac
exec {real} "$@"
"""


@pytest.mark.integration
def test_a_status_query_failing_for_a_while_loses_no_job(cluster, tmp_path, monkeypatch):
    # Plugin 2.8.0 forgets its active jobs when the last attempt of a status query fails, and
    # Snakemake then waits forever (the profile's comment). Here squeue fails for 15 s: the
    # plugin's default 5 attempts at up to 10 per second span under a second (with those, this run
    # hung after 5 failed queries: checked by hand, 2026-11-23); the profile's 60 at one per second
    # span a minute.
    real = shutil.which("squeue")
    assert real, "squeue not on PATH"
    bindir, state = tmp_path / "bin", tmp_path / "flaky"
    bindir.mkdir()
    state.mkdir()
    squeue = bindir / "squeue"
    squeue.write_text(FLAKY_SQUEUE.format(real=shlex.quote(real)))
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STATE_DIR", str(state))
    monkeypatch.setenv("FAIL_S", "15")
    proc = _slurm_snakemake(tmp_path, json.loads(json.dumps(TINY)), "results/world/passages.parquet", timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    # The queries failed through the plugin, more often than its default attempts, and it went on.
    failures = (state / "failures").read_text().count("x")
    assert failures > 5, failures
    assert "could not check status" in proc.stdout + proc.stderr
    assert (tmp_path / "results/world/passages.parquet").stat().st_size > 0
