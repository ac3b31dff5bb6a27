"""Install the wheels carried to a lent GPU machine without building anything over its python
(scripts/gpu_check.sh's install step; docs/GPU.md).

    python3 scripts/gpu_wheels.py --wheels wheels --target /tmp/ragrl-gpu-check/site --json install.json

The first lent machine's `python3` was itself a venv holding the CUDA torch (/opt/torch/.venv): a
venv made over it with --system-site-packages builds on the *base* interpreter, and torch, numpy
and accelerate vanished. So nothing is made over it: the wheels go into one directory with
`pip install --no-index --no-deps --target`, which gpu_check.sh puts on PYTHONPATH. PYTHONPATH
comes before site-packages on sys.path, so a wheel there would shadow the machine's own copy:
torch is never installed, and a wheel is skipped when this python already has its distribution or
one of the modules it would install. Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

# The machine's CUDA build is the point of the check; a carried torch would be a CPU or other-CUDA one.
NEVER = {"torch"}


def canonical(name: str) -> str:
    """PEP 503's normalised project name: `Py_CPUInfo` and `py-cpuinfo` are one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path) -> tuple[str, str, str]:
    """(distribution, version, tags) from a wheel's file name (PEP 427)."""
    parts = path.name[: -len(".whl")].split("-")
    if not path.name.endswith(".whl") or len(parts) not in (5, 6):
        raise ValueError(f"{path.name}: not a wheel file name (name-version[-build]-python-abi-platform.whl)")
    return canonical(parts[0]), parts[1], "-".join(parts[-3:])


def wheel_modules(path: Path) -> dict[str, bool]:
    """Top-level import names the wheel would install -> whether each is a regular package (has an
    __init__.py; a namespace package, like `google`, may be shared by several distributions)."""
    modules: dict[str, bool] = {}
    with zipfile.ZipFile(path) as zf:
        for name in zf.namelist():
            parts = name.split("/")
            if parts[0].endswith(".data") and len(parts) > 2 and parts[1] in ("purelib", "platlib"):
                parts = parts[2:]
            elif parts[0].endswith((".dist-info", ".data")):
                continue
            top = parts[0].split(".")[0]
            if not top.isidentifier():
                continue
            if len(parts) == 1:
                if parts[0].endswith((".py", ".so", ".pyd")):
                    modules[top] = True
            else:
                modules[top] = modules.get(top, False) or parts[1] == "__init__.py"
    return modules


def machine_distributions() -> dict[str, str]:
    """Distributions this python sees (sys.path as started) -> version."""
    found = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical(name), dist.version)
    return found


def shadowed(module: str, regular: bool) -> bool:
    """True when this python already imports `module`, so the wheel's copy would replace it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    # Two namespace-package halves merge instead of shadowing each other.
    return regular or spec.origin not in (None, "namespace")


def plan(wheels: list[Path], target: Path) -> tuple[list[Path], list[dict]]:
    """(wheels to install, skipped wheels with the reason)."""
    have = machine_distributions()
    stems = [d.name[: -len(".dist-info")].rsplit("-", 1) for d in target.glob("*-*.dist-info")]
    in_target = {(canonical(name), version) for name, version in stems}
    todo, skipped = [], []
    for w in wheels:
        try:
            dist, version, _ = wheel_name(w)
        except ValueError as exc:
            skipped.append({"wheel": w.name, "reason": str(exc)})
            continue
        if dist in NEVER:
            skipped.append({"wheel": w.name, "reason": "torch is never installed: the machine's own (CUDA) build is used"})
        elif dist in have:
            skipped.append({"wheel": w.name, "reason": f"the machine has {dist} {have[dist]}"})
        elif (dist, version) in in_target:
            skipped.append({"wheel": w.name, "reason": "already in the target directory (an earlier run)"})
        else:
            clash = sorted(m for m, regular in wheel_modules(w).items() if shadowed(m, regular))
            if clash:
                skipped.append({"wheel": w.name, "reason": f"would shadow the machine's module(s) {', '.join(clash)}"})
            else:
                todo.append(w)
    return todo, skipped


def has_pip() -> bool:
    return subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0


def pip_install(wheels: list[Path], target: Path) -> tuple[list[str], list[dict]]:
    """All wheels in one pip call; when that fails, one call per wheel, so one wheel built for
    another python does not keep the others out."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--upgrade",
           "--disable-pip-version-check", "--target", str(target)]
    if subprocess.run(cmd + [str(w) for w in wheels]).returncode == 0:
        return [w.name for w in wheels], []
    done, failed = [], []
    for w in wheels:
        proc = subprocess.run(cmd + [str(w)], capture_output=True, text=True)
        if proc.returncode == 0:
            done.append(w.name)
        else:
            failed.append({"wheel": w.name, "error": (proc.stderr or proc.stdout).strip()[-1000:]})
    return done, failed


def _compatible(tags: str) -> bool:
    """A rough version of pip's tag check, for the unzip route: this python's version and the
    machine's architecture (pip's check is exact; this only keeps out the plainly wrong)."""
    py, abi, plat = tags.split("-")
    major, minor = sys.version_info[:2]
    ok_py = {f"py{major}", f"py{major}{minor}", f"cp{major}{minor}"}
    if abi == "abi3":  # the stable ABI: built for 3.k, runs on every later 3.x
        ok_py |= {f"cp{major}{k}" for k in range(2, minor + 1)}
    plat_ok = plat == "any" or (sys.platform.startswith("linux") and "linux" in plat and platform.machine() in plat)
    return bool(ok_py & set(py.split("."))) and plat_ok


def unzip_install(wheels: list[Path], target: Path) -> tuple[list[str], list[dict]]:
    """What pip does with a wheel for --target, for a python without pip: the archive's files under
    target, a .data dir's purelib/platlib merged in, its scripts in target/bin."""
    done, failed = [], []
    for w in wheels:
        _, _, tags = wheel_name(w)
        if not _compatible(tags):
            failed.append({"wheel": w.name, "error": f"tags {tags} do not fit python {sys.version.split()[0]} "
                                                     f"on {platform.machine()}"})
            continue
        with zipfile.ZipFile(w) as zf:
            for info in zf.infolist():
                parts = info.filename.split("/")
                if parts[0].endswith(".data") and len(parts) > 2:
                    if parts[1] in ("purelib", "platlib"):
                        parts = parts[2:]
                    elif parts[1] == "scripts":
                        parts = ["bin", *parts[2:]]
                    else:
                        continue  # headers, data: not needed to import
                if info.is_dir() or ".." in parts:
                    continue
                dest = target.joinpath(*parts)
                dest.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out)
                if parts[0] == "bin" or (info.external_attr >> 16) & 0o111:
                    dest.chmod(0o755)
        done.append(w.name)
    return done, failed


def install(wheel_dir: Path, target: Path, use_pip: bool | None = None) -> dict:
    wheels = sorted(wheel_dir.glob("*.whl")) if wheel_dir.is_dir() else []
    target.mkdir(parents=True, exist_ok=True)
    todo, skipped = plan(wheels, target)
    use_pip = has_pip() if use_pip is None else use_pip
    installed, failed = ([], []) if not todo else (pip_install if use_pip else unzip_install)(todo, target)
    return {"python": sys.executable, "version": sys.version.split()[0], "wheels_dir": str(wheel_dir),
            "wheels_found": len(wheels), "target": str(target), "method": "pip --target" if use_pip else "unzip",
            "installed": installed, "skipped": skipped, "failed": failed,
            "sha256": {w.name: hashlib.sha256(w.read_bytes()).hexdigest()[:16] for w in wheels}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", type=Path, required=True)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    # This python's own view decides what is "the machine's": the target must not be on it yet.
    target = args.target.resolve()
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != target]
    report = install(args.wheels, target)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    for item in report["skipped"]:
        print(f"   skipped {item['wheel']}: {item['reason']}")
    for item in report["failed"]:
        print(f"   FAILED {item['wheel']}: {item['error'].splitlines()[-1] if item['error'] else ''}")
    print(f"   installed {len(report['installed'])} of {report['wheels_found']} wheel(s) into {target} "
          f"({report['method']})")


if __name__ == "__main__":
    main()
