"""A job's log (`ragrl ... > log 2>&1`) ends with a newline (issue 18 F12)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")

# A command whose last output is a progress bar closed with a carriage return, as tqdm leaves one.
_SCRIPT = """
import sys
import ragrl.cli as cli
import ragrl.cli.models
ragrl.cli.models._cmd_world = lambda args: sys.stderr.write("progress 100%|##########| 3/3\\r")
sys.exit(cli.main(["world", "--seed", "1", "--out", "unused"]))
"""


def test_log_ends_with_newline(tmp_path):
    log = tmp_path / "job.log"
    with open(log, "wb") as out:
        subprocess.run([sys.executable, "-c", _SCRIPT], stdout=out, stderr=subprocess.STDOUT, check=True,
                       env=dict(os.environ, PYTHONPATH=SRC))
    text = log.read_bytes()
    assert text.startswith(b"$ ragrl world") and text.endswith(b"3/3\r\n")
