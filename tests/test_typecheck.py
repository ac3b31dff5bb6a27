"""The static check of src/ (mypy, configured in pyproject.toml) passes, and it catches what it is
there for: an import of a name that does not exist (the verl launcher once imported a helper
from a module that no longer had it, and no test reached that line)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
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
