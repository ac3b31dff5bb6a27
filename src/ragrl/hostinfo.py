"""What machine computed a result: the facts that make two runs of one commit differ.

Float rounding differs between CPU kinds (the same SFT job gave other weights on an AMD EPYC than
on an Intel Xeon, both with AVX-512; MKL and oneDNN pick kernels by vendor as well as ISA, the
likely cause, not measured), between torch builds and between GPUs. A result that records these
lets a reader tell "another host" from "another code". This describes the calling process only: a
model trained or served elsewhere is not described by it. Standard library only; torch is
described when the process has it imported.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

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
