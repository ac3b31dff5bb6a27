"""What machine computed a result: the facts that make two runs of one commit differ.

Float rounding differs between CPU kinds (the same SFT job gave other weights on an AMD EPYC than
on an Intel Xeon, both with AVX-512; MKL and oneDNN pick kernels by vendor as well as ISA, the
likely cause, not measured), between torch builds and between GPUs. A result that records these
lets a reader tell "another host" from "another code". `host_info` describes the calling
process. A trained model describes the hosts that trained it in its `host.json` (`RECORD`): one
segment per start of its training (a job resumed on another node adds one), and the record of
the model it started from, so an RL checkpoint names the hosts of its RL, its SFT and its
pretraining; `lineage` flattens that chain for the results database. No third-party import
(`ragrl.io` and `ragrl.errors` only); torch is described when the process has it imported.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from ragrl.errors import DataFormatError
from ragrl.io import write_json, write_text

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
HOST_FIELDS = ("cpu", "cpu_capability", "torch", "cuda_device")  # strings or null
_MAX_DEPTH = 64  # a start chain longer than this is a cycle or a corrupt record


def segment(from_step: int = 0) -> dict[str, Any]:
    """One start of a training: the step it began from and the host its main process ran on (a
    multi-process job's other ranks are not described)."""
    return {"from_step": int(from_step), **host_info()}


def training_record(stage: str, segments: list[dict[str, Any]], start: dict | None = None) -> dict:
    """What `RECORD` holds: the stage ("pretrain", "sft", "rl", "harr"), its segments (`segment`),
    and `start`, the record of the model it started from (`read_record`; None when that model has
    none: a hub checkpoint, the shipped pretrained base, a model the verl backend trained)."""
    return {"stage": stage, "segments": list(segments), "start": start}


def write_record(model_dir: str | os.PathLike, record: dict) -> None:
    write_json(record, Path(model_dir, RECORD))


def read_record(model_dir: str | os.PathLike) -> dict | None:
    """The model directory's `RECORD`, checked, or None when it has none (or is not a directory:
    a hub id). Read it before the work it describes, so a malformed one fails the job at once."""
    path = Path(model_dir, RECORD)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataFormatError(path, f"not JSON: {e}") from None
    _check_record(path, record)
    return record


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_host(path: str | os.PathLike, host: Any, field: str, line: int | None = None) -> None:
    """A host_info object: an object whose HOST_FIELDS are strings or null."""
    if not isinstance(host, dict):
        raise DataFormatError(path, f"expected an object (ragrl.hostinfo.host_info), got {type(host).__name__}",
                              field=field, line=line)
    for key in HOST_FIELDS:
        if host.get(key) is not None and not isinstance(host[key], str):
            raise DataFormatError(path, f"expected a string or null, got {host[key]!r}", field=f"{field}.{key}",
                                  line=line)


def _check_segment(path: Path, value: Any, field: str, line: int | None = None) -> None:
    if not isinstance(value, dict):
        raise DataFormatError(path, f"expected an object, got {type(value).__name__}", field=field, line=line)
    if not _is_int(value.get("from_step")):
        raise DataFormatError(path, f"expected an integer, got {value.get('from_step')!r}",
                              field=f"{field}.from_step" if field else "from_step", line=line)
    check_host(path, value, field or "segment", line)


def _check_record(path: Path, record: Any) -> None:
    prefix = ""
    for _ in range(_MAX_DEPTH):
        if not isinstance(record, dict):
            raise DataFormatError(path, f"expected an object, got {type(record).__name__}",
                                  field=prefix.rstrip(".") or None)
        if not isinstance(record.get("stage"), str):
            raise DataFormatError(path, f"expected a string, got {record.get('stage')!r}", field=f"{prefix}stage")
        segments = record.get("segments")
        if not isinstance(segments, list):
            raise DataFormatError(path, f"expected a list, got {type(segments).__name__}", field=f"{prefix}segments")
        for i, s in enumerate(segments):
            _check_segment(path, s, f"{prefix}segments[{i}]")
        record = record.get("start")
        if record is None:
            return
        prefix += "start."
    raise DataFormatError(path, f"the chain of start records is longer than {_MAX_DEPTH}", field=prefix.rstrip("."))


def read_segments(work_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The segments of a resumable training (`append_segment`), in order."""
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
        _check_segment(path, value, "", line=n)
        out.append(value)
    return out


def append_segment(work_dir: str | os.PathLike, from_step: int) -> list[dict[str, Any]]:
    """Note that a training (re)starts at `from_step` on this host, and return the segments. A
    start whose work was lost (a kill before the next checkpoint, a resume from an earlier one)
    is dropped with its steps, as the training log is cut back to the checkpoint; a run killed on
    one node and resumed on another names both. Rewritten whole and replaced atomically, so a
    kill never leaves half a line."""
    kept = [s for s in read_segments(work_dir) if s["from_step"] < from_step] + [segment(from_step)]
    write_text("".join(json.dumps(s, sort_keys=True) + "\n" for s in kept), Path(work_dir, SEGMENTS))
    return kept


def training_segments(work_dir: str | os.PathLike, from_step: int, steps: int) -> list[dict[str, Any]]:
    """The segments of a resumable training of `steps` steps entering at `from_step`: a start
    when steps are left to run; a re-entry with none left (a finished run, a kill while writing
    the final model) adds none."""
    return append_segment(work_dir, from_step) if from_step < steps else read_segments(work_dir)


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


def trained_hosts(models: Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """The hosts that trained each of `models` (model directories), its pretraining first:
    `lineage` rows with their "model"; a hub id or a model without a record adds none."""
    return [{"model": str(m), **row} for m in models for row in lineage(read_record(m))]


def check_trained_row(path: str | os.PathLike, row: Any, field: str) -> None:
    """One `trained_hosts` row as a metrics.json carries it."""
    if not isinstance(row, dict):
        raise DataFormatError(path, f"expected an object, got {type(row).__name__}", field=field)
    for key in ("model", "stage", "segment", "from_step"):
        ok = isinstance(row.get(key), str) if key in ("model", "stage") else _is_int(row.get(key))
        if not ok:
            what = "a string" if key in ("model", "stage") else "an integer"
            raise DataFormatError(path, f"expected {what}, got {row.get(key)!r}", field=f"{field}.{key}")
