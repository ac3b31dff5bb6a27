"""`make test` runs the suite in two stages chosen by marker (Makefile: `make test-fast` with
FAST_TESTS, then SLOW_TESTS), so no test may fall between them or run in both: read off a real
collection of tests/, the first stage's selection and the second's are disjoint and together
hold every collected test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAKEFILE = (REPO / "Makefile").read_text()

# pytest's public hook for the tests `-m` leaves out: the probe prints them next to the selected.
PROBE = '''
def pytest_deselected(items):
    for item in items:
        print("DESELECTED", item.nodeid)
'''


def _variable(name: str) -> str:
    found = re.search(rf"^{name}\s*:=\s*(.+)$", MAKEFILE, re.M)
    assert found, f"the Makefile sets no {name}"
    return found.group(1).strip()


def test_the_makefile_stages_use_the_two_expressions():
    fast, slow = _variable("FAST_TESTS"), _variable("SLOW_TESTS")
    assert fast == f"not ({slow})", (fast, slow)  # the second stage is exactly what the first leaves
    assert '-m "$(FAST_TESTS)"' in MAKEFILE.split("\ntest-fast:", 1)[1].split("\n\n", 1)[0]
    assert '-m "$(SLOW_TESTS)"' in MAKEFILE.split("\ntest:", 1)[1].split("\n\n", 1)[0]


@pytest.mark.slow  # two collections of tests/: ~30 s of CPU
def test_the_two_stages_split_the_collected_tests(tmp_path):
    (tmp_path / "stages_probe.py").write_text(PROBE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    # Both collections at once: each imports every test module (~10 s of CPU).
    procs = [subprocess.Popen([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "stages_probe",
                               "-p", "no:cacheprovider", "-m", _variable(name), "tests"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in ("FAST_TESTS", "SLOW_TESTS")]
    selected, deselected = [], []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:] + err[-3000:]
        lines = out.splitlines()
        selected.append({line for line in lines if line.startswith("tests/") and "::" in line})
        deselected.append({line.split(" ", 1)[1] for line in lines if line.startswith("DESELECTED ")})
    fast, slow = selected
    assert fast and slow
    assert not fast & slow, sorted(fast & slow)[:20]  # none runs twice
    assert fast | slow == fast | deselected[0] == slow | deselected[1], sorted(deselected[0] ^ slow)[:20]
    assert deselected[0] == slow and deselected[1] == fast  # none is lost between the stages
