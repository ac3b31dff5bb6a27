"""What machine computed a result: the facts that make two runs of one commit differ.

Float rounding differs between CPU kinds (the same SFT job gave other weights on an AMD EPYC than
on an Intel Xeon, both with AVX-512; MKL and oneDNN pick kernels by vendor as well as ISA, the
likely cause, not measured), between torch builds and between GPUs. A result that records these
lets a reader tell "another host" from "another code". `host_info` describes the calling
process. A trained model describes the hosts that trained it in its `host.json` (`RECORD`): one
segment per start of its training (a job resumed on another node adds one), and the record of
the model it started from, so an RL checkpoint names the hosts of its RL, its SFT and its
pretraining; `lineage` flattens that chain for the results database. Standard library only;
torch is described when the process has it imported.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from ragrl.errors import DataFormatError

# Settings that change which kernels torch, MKL and oneDNN run, hence the rounding.
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
              "OMP_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG")


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name ("model name" of /proc/cpuinfo; `platform.processor()` elsewhere)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("model name", "Processor", "cpu model"):
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def host_info() -> dict[str, Any]:
    """A JSON object: platform, CPU model, Python; with torch imported also its version, the CPU
    kernels it dispatches to and the CUDA device; the kernel-choosing environment variables set."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = str(torch.__version__)
        try:
            info["cpu_capability"] = str(torch.backends.cpu.get_cpu_capability())
        except (AttributeError, RuntimeError):
            info["cpu_capability"] = None
        try:
            info["cuda_device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        except (AttributeError, RuntimeError, AssertionError):
            info["cuda_device"] = None
    env = {k: os.environ[k] for k in KERNEL_ENV if k in os.environ}
    if env:
        info["env"] = env
    return info


RECORD = "host.json"  # in a model directory: the hosts that trained it (`training_record`)
SEGMENTS = "hosts.jsonl"  # in a resumable training's work directory: one line per start
_MAX_DEPTH = 64  # a start chain longer than this is a cycle or a corrupt record


def segment(from_step: int = 0) -> dict[str, Any]:
    """One start of a training: the step it began from and the host it ran on."""
    return {"from_step": int(from_step), **host_info()}


def training_record(stage: str, segments: list[dict[str, Any]], start: str | os.PathLike | None = None) -> dict:
    """What `RECORD` holds: the stage ("pretrain", "sft", "rl", ...), its segments (`segment`),
    and `start`, the record of the model it started from (None when that model has none: a hub
    checkpoint, a model trained before records existed, the verl backend's)."""
    return {"stage": stage, "segments": list(segments), "start": read_record(start) if start is not None else None}


def write_record(model_dir: str | os.PathLike, record: dict) -> None:
    Path(model_dir, RECORD).write_text(json.dumps(record, sort_keys=True, indent=1) + "\n", encoding="utf-8")


def read_record(model_dir: str | os.PathLike) -> dict | None:
    """The model directory's `RECORD`, or None when it has none (or is not a directory: a hub id)."""
    path = Path(model_dir, RECORD)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataFormatError(path, f"not JSON: {e}") from None
    _check_record(path, record)
    return record


def _check_record(path: Path, record: Any, where: str = "") -> None:
    for depth in range(_MAX_DEPTH):
        if not isinstance(record, dict):
            raise DataFormatError(path, f"expected an object, got {type(record).__name__}", field=where or None)
        if not isinstance(record.get("stage"), str):
            raise DataFormatError(path, "expected a string", field=f"{where}stage")
        segments = record.get("segments")
        if not isinstance(segments, list) or not all(isinstance(s, dict) for s in segments):
            raise DataFormatError(path, "expected a list of objects", field=f"{where}segments")
        for i, s in enumerate(segments):
            if not isinstance(s.get("from_step"), int):
                raise DataFormatError(path, f"expected an integer, got {s.get('from_step')!r}",
                                      field=f"{where}segments[{i}].from_step")
        record = record.get("start")
        if record is None:
            return
        where = f"{where}start."
    raise DataFormatError(path, f"the chain of start records is longer than {_MAX_DEPTH}", field=where)


def read_segments(work_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The segments a resumable training appended to `SEGMENTS` (`append_segment`), in order."""
    path = Path(work_dir, SEGMENTS)
    if not path.is_file():
        return []
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataFormatError(path, f"not JSON: {e}", line=n) from None
        if not isinstance(value, dict) or not isinstance(value.get("from_step"), int):
            raise DataFormatError(path, "expected an object with an integer from_step", line=n, field="from_step")
        out.append(value)
    return out


def append_segment(work_dir: str | os.PathLike, from_step: int) -> None:
    """Note that a training (re)starts here at `from_step`: each start of a resumable job adds a
    line, so a run killed on one node and resumed on another names both."""
    with open(Path(work_dir, SEGMENTS), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(segment(from_step), sort_keys=True) + "\n")


def lineage(record: dict | None) -> list[dict[str, Any]]:
    """The record's chain as rows, the first training first: {"stage", "segment", "from_step",
    "host"} per segment ("host": the segment's host_info)."""
    chain = []
    while record is not None and len(chain) < _MAX_DEPTH:
        chain.append(record)
        record = record.get("start")
    rows = []
    for rec in reversed(chain):
        for i, s in enumerate(rec["segments"]):
            host = {k: v for k, v in s.items() if k != "from_step"}
            rows.append({"stage": rec["stage"], "segment": i, "from_step": s["from_step"], "host": host})
    return rows
