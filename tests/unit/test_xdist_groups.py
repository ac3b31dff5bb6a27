"""tests/conftest.py's split of the suite over xdist workers, read off a real collection."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Runs after conftest's hook and prints what xdist would schedule by: node id, group.
PROBE = '''
import pytest

@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        print("GROUP", item.nodeid, "|", item.get_closest_marker("xdist_group").args[0])
'''


def test_groups_keep_module_fixtures_together_and_split_the_end_to_end_runs(tmp_path):
    (tmp_path / "groups_probe.py").write_text(PROBE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    files = ["tests/backends/test_slurm.py", "tests/workflow/test_paper_twins.py", "tests/workflow/test_workflow.py"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "groups_probe",
                           "-p", "no:cacheprovider", *files], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    order = [line[len("GROUP "):].split(" | ") for line in proc.stdout.splitlines() if line.startswith("GROUP ")]
    group = dict(order)

    # The SLURM tests share the module's cluster fixture: one unit, on one worker.
    slurm = {g for n, g in order if n.startswith("tests/backends/test_slurm.py")}
    assert slurm == {"tests/backends/test_slurm.py"}, slurm
    # Each twin is a Snakemake run in its own temp dir: a unit each.
    twins = [g for n, g in order if "test_twin_runs_the_whole_dag" in n]
    assert len(twins) == len(set(twins)) == len(list((REPO / "config/test").glob("*.yaml"))), twins
    assert not any("]" in g or "@" in g for g in twins), twins  # xdist reads a group after the last "@"
    # The workflow's end-to-end run is a unit of its own; its dry-run checks stay with their file.
    e2e = group["tests/workflow/test_workflow.py::test_workflow_runs_end_to_end"]
    assert e2e != "tests/workflow/test_workflow.py" and "@" not in e2e and "]" not in e2e
    dry = {g for n, g in order if "test_bad_config_stops_before_any_job" in n}
    assert dry == {"tests/workflow/test_workflow.py"}
    # Units holding an integration test are handed out before the rest.
    first_light = next(i for i, (n, _) in enumerate(order) if "test_bad_config" in n or "has_a_twin" in n)
    assert "tests/backends/test_slurm.py" in {g for _, g in order[:first_light]} and e2e in {g for _, g in order[:first_light]}


WORKER_SUITE = '''
import os

import pytest

STARTS = []


@pytest.fixture(scope="module")
def server():
    # One start per worker that runs this file: the count is what the grouping must keep at 1.
    with open(os.path.join(os.environ["GROUPS_OUT"], "starts"), "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
    return object()


@pytest.mark.parametrize("i", range(8))
def test_uses_the_server(server, i):
    with open(os.path.join(os.environ["GROUPS_OUT"], "ran"), "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
'''


@pytest.mark.slow
def test_a_module_fixture_starts_once_on_real_workers(tmp_path):
    """The scheduling itself, not only the marks: eight tests sharing a module fixture, run by
    `pytest -n 2 --dist loadgroup` with this conftest, all run on one worker and start it once
    (pytest 9.2 with xdist 3.8 ignored the groups: requirements.txt)."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text((REPO / "tests/conftest.py").read_text())
    (suite / "test_shared.py").write_text(WORKER_SUITE)
    (suite / "test_other.py").write_text("def test_a():\n    pass\n\n\ndef test_b():\n    pass\n")
    env = dict(os.environ, GROUPS_OUT=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
                           "-p", "no:cacheprovider", "-p", "no:randomly", str(suite)],
                          cwd=suite, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = (tmp_path / "ran").read_text().split()
    assert len(ran) == 8 and len(set(ran)) == 1, ran
    assert (tmp_path / "starts").read_text().split() == ran[:1]


def test_scontrol_fails_at_once_under_the_suites_slurm_conf():
    """conftest's stub SLURM_CONF: where the SLURM client is installed, the SLURM executor plugin's
    `scontrol show config` at Snakemake's start fails at once instead of waiting 10 s on a
    controller that is not there (else every Snakemake call of the suite pays it)."""
    import shutil
    import time

    from conftest import STUB_SLURM_CONF, USER_SLURM_CONF

    if shutil.which("scontrol") is None or USER_SLURM_CONF is not None:
        pytest.skip("no SLURM client here, or a SLURM_CONF of the user's (kept as it is)")
    assert os.environ["SLURM_CONF"] == str(STUB_SLURM_CONF) and STUB_SLURM_CONF.is_file()
    started = time.monotonic()
    proc = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and time.monotonic() - started < 3, (proc.returncode, proc.stderr[-500:])
