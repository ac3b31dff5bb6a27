"""Run manifests: what the results database needs to tell runs apart and reproduce them.

Standard library only, so the manifest job does not pay for importing torch.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from ragrl.io import canonical_json, write_json


def git_commit(cwd: Path | None = None) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=cwd, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def run_manifest(run_id: str, recipe: str, model: str, stage: str, settings: dict, seeds: dict, out: Path) -> dict:
    manifest = {
        "run_id": run_id,
        "recipe": recipe,
        "model": model,
        "stage": stage,
        "config_hash": hashlib.sha256(canonical_json(settings).encode()).hexdigest()[:16],
        "git_commit": git_commit(),
        "seeds": seeds,
        "settings": settings,
    }
    write_json(manifest, out)
    return manifest
