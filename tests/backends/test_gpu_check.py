"""scripts/gpu_check.sh on this CPU machine (issue #38): the wheel install route, on a python like the
lent GPU machine's, and the parts it added, through the script.

The first lent machine's `python3` was a venv (/opt/torch/.venv) holding the CUDA torch; the script
made `.gpu-venv` over it with --system-site-packages, which starts from the *base* interpreter, and
torch vanished. `machine_python` rebuilds that setting: a venv made from this suite's venv, whose
own site-packages hold torch (a .pth to the suite's packages), so a venv made over it loses torch
exactly as there. The script must install the carried wheels beside that python, never over it.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts/gpu_check.sh"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / f"scripts/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_wheel(directory: Path, dist: str, version: str, files: dict[str, str], tag: str = "py3-none-any") -> Path:
    """A wheel written by hand (PEP 427): the files, METADATA, WHEEL and a RECORD with hashes."""
    info = f"{dist}-{version}.dist-info"
    files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n",
             f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test_gpu_check\nRoot-Is-Purelib: true\nTag: {tag}\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    path = directory / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in {**files, f"{info}/RECORD": "\n".join(record) + "\n"}.items():
            zf.writestr(name, text)
    return path


def carried_wheels(directory: Path) -> dict[str, Path]:
    """What ./wheels could hold: one wheel the machine lacks, and four the script must not install."""
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "new": make_wheel(directory, "ragrl_probe_pkg", "1.0", {"ragrl_probe_pkg/__init__.py": "VALUE = 42\n"}),
        # A carried torch (CPU or another CUDA) in front of the machine's would be the worst outcome.
        "torch": make_wheel(directory, "torch", "99.0", {"torch/__init__.py": "raise ImportError('carried torch')\n"}),
        "have": make_wheel(directory, "tqdm", "0.0.1", {"tqdm/__init__.py": "raise ImportError('carried tqdm')\n"}),
        # Another distribution's name, the machine's module: PYTHONPATH would put it first.
        "shadow": make_wheel(directory, "numpy_shadow", "1.0", {"numpy/__init__.py": "raise ImportError('shadow')\n"}),
        "other_python": make_wheel(directory, "ragrl_probe_cp99", "1.0", {"ragrl_probe_cp99.py": "X = 1\n"},
                                   tag="cp99-cp99-manylinux_2_28_x86_64"),
    }


@pytest.fixture(scope="module")
def machine_python(tmp_path_factory) -> Path:
    """A venv made from this suite's venv python, with torch in its own site-packages."""
    root = tmp_path_factory.mktemp("machine")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    python = root / "venv/bin/python"
    # What such a venv sees: the base interpreter's packages, not the venv it was made from.
    assert _imports(python, "torch", {}).returncode != 0
    site = Path(_run(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])", {}).stdout.strip())
    (site / "suite_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    assert _imports(python, "torch", {}).returncode == 0
    return python


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("GPU_CHECK_")}
    return {**env, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **extra}


def _run(python: Path, code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=_env(**env), timeout=120)


def _imports(python: Path, module: str, env: dict) -> subprocess.CompletedProcess:
    return _run(python, f"import {module}", env)


@pytest.mark.slow
def test_a_venv_made_over_the_machine_python_loses_its_torch(machine_python, tmp_path):
    """The shipped script's route, for the record: why the install goes beside the python instead."""
    subprocess.run([str(machine_python), "-m", "venv", "--without-pip", "--system-site-packages", str(tmp_path / "v")],
                   check=True, timeout=120)
    proc = _imports(tmp_path / "v/bin/python", "torch", {})
    assert proc.returncode != 0 and "No module named 'torch'" in proc.stderr


@pytest.mark.slow
def test_install_only_puts_the_missing_wheel_beside_the_machine_python(machine_python, tmp_path):
    wheels = carried_wheels(tmp_path / "wheels")
    env = {"GPU_CHECK_PYTHON": str(machine_python), "GPU_CHECK_WHEELS": str(tmp_path / "wheels"),
           "GPU_CHECK_WORK": str(tmp_path / "work")}
    proc = subprocess.run(["bash", str(SCRIPT), "--install-only", str(tmp_path / "out")], capture_output=True, text=True,
                          env=_env(**env), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("PYTHONPATH="), proc.stdout
    pythonpath = last[len("PYTHONPATH="):]
    site = (tmp_path / "work/site").resolve()
    assert [Path(p).resolve() for p in pythonpath.split(":")] == [REPO / "src", site]

    report = json.loads((tmp_path / "out/install.json").read_text())
    assert report["installed"] == [wheels["new"].name], report
    reasons = {s["wheel"]: s["reason"] for s in report["skipped"]}
    assert "never installed" in reasons[wheels["torch"].name]
    assert "the machine has tqdm" in reasons[wheels["have"].name]
    assert "shadow the machine's module(s) numpy" in reasons[wheels["shadow"].name]
    assert [f["wheel"] for f in report["failed"]] == [wheels["other_python"].name], report["failed"]
    assert not (site / "torch").exists() and not (site / "numpy").exists()

    code = ("import json, numpy, ragrl, ragrl_probe_pkg, torch, tqdm; "
            "print(json.dumps({m.__name__: m.__file__ for m in (numpy, ragrl, ragrl_probe_pkg, torch, tqdm)}))")
    seen = _run(machine_python, code, {"PYTHONPATH": pythonpath})
    assert seen.returncode == 0, seen.stderr
    files = json.loads(seen.stdout)
    assert Path(files["ragrl_probe_pkg"]).resolve().is_relative_to(site)
    assert Path(files["ragrl"]).resolve().is_relative_to(REPO / "src")
    suite = Path(sysconfig.get_paths()["purelib"]).resolve()
    for module in ("torch", "numpy", "tqdm"):  # the machine's own, in front of anything carried
        assert Path(files[module]).resolve().is_relative_to(suite), (module, files[module])

    again = subprocess.run(["bash", str(SCRIPT), "--install-only", str(tmp_path / "out")], capture_output=True,
                           text=True, env=_env(**env), timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    rerun = json.loads((tmp_path / "out/install.json").read_text())
    assert rerun["installed"] == [] and any("earlier run" in s["reason"] for s in rerun["skipped"]), rerun


def test_without_pip_the_wheels_are_unpacked_like_pip_would(tmp_path):
    gpu_wheels = _load("gpu_wheels")
    wheels = carried_wheels(tmp_path / "wheels")
    make_wheel(tmp_path / "wheels", "ragrl_probe_tool", "2.0", {
        "ragrl_probe_tool/__init__.py": "",
        "ragrl_probe_tool-2.0.data/purelib/ragrl_probe_extra.py": "Y = 2\n",
        "ragrl_probe_tool-2.0.data/scripts/ragrl-probe": "#!/bin/sh\necho probe\n",
    })
    report = gpu_wheels.install(tmp_path / "wheels", tmp_path / "site", use_pip=False)
    assert report["method"] == "unzip"
    assert sorted(report["installed"]) == sorted([wheels["new"].name, "ragrl_probe_tool-2.0-py3-none-any.whl"])
    assert [f["wheel"] for f in report["failed"]] == [wheels["other_python"].name]
    assert (tmp_path / "site/ragrl_probe_pkg/__init__.py").read_text() == "VALUE = 42\n"
    assert (tmp_path / "site/ragrl_probe_extra.py").exists()
    assert os.access(tmp_path / "site/bin/ragrl-probe", os.X_OK)


def test_report_keeps_a_failed_part_with_its_log_tail(tmp_path):
    check = _load("gpu_check")
    (tmp_path / "good.json").write_text(json.dumps({"part": "good", "tokens_per_s": 5.0}))
    (tmp_path / "bad.log").write_text("".join(f"line {i}\n" for i in range(100)) + "RuntimeError: out of memory\n")
    (tmp_path / "machine.log").write_text("== machine\nNVIDIA H100 80GB HBM3, 81559 MiB\n")
    args = check.argparse.Namespace(json=str(tmp_path / "gpu_check.json"), dir=str(tmp_path), install=None,
                                    machine=str(tmp_path / "machine.log"), smoke=False,
                                    status=["good:0:12", "bad:1:40", "slow:124:300"])
    check.cmd_report(args)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["machine"] == ["NVIDIA H100 80GB HBM3, 81559 MiB"]
    assert report["parts"]["good"] == {"status": "ok", "rc": 0, "wall_s": 12, "part": "good", "tokens_per_s": 5.0}
    assert report["parts"]["bad"]["status"] == "failed"
    assert report["parts"]["bad"]["error_tail"].endswith("RuntimeError: out of memory")
    assert "line 69" not in report["parts"]["bad"]["error_tail"]
    assert report["parts"]["slow"]["status"] == "timed out"


@pytest.mark.slow
def test_the_new_parts_run_through_the_script_on_cpu(machine_python, tmp_path):
    """GRPO against TRL and the generation benchmark, on the small shape, under the machine-like
    python with the PYTHONPATH the script sets: every figure lands in gpu_check.json."""
    (tmp_path / "wheels").mkdir()
    env = {"GPU_CHECK_PYTHON": str(machine_python), "GPU_CHECK_WHEELS": str(tmp_path / "wheels"),
           "GPU_CHECK_WORK": str(tmp_path / "work"), "GPU_CHECK_SMOKE": "1",
           "GPU_CHECK_PARTS": "grpo_vs_trl generation"}
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True,
                          env=_env(**env), timeout=600)
    logs = {p.name: p.read_text()[-3000:] for p in (tmp_path / "out").glob("*.log")}
    assert proc.returncode == 0, (proc.stdout[-3000:], logs)
    report = json.loads((tmp_path / "out/gpu_check.json").read_text())
    assert report["smoke"] is True
    assert list(report["parts"]) == ["model", "grpo_vs_trl", "generation"]
    assert all(p["status"] == "ok" for p in report["parts"].values()), report["parts"]

    vs = report["parts"]["grpo_vs_trl"]
    assert [r["trainer"] for r in vs["runs"]] == ["ragrl", "trl"]
    for trainer in ("ragrl", "trl"):
        run = next(r for r in vs["runs"] if r["trainer"] == trainer)
        assert len(run["steps"]) == 2, run
        # 4 prompts x 2 samples x 8 new tokens, unless a sample stopped early
        assert all(0 < s["generated_tokens"] <= 64 and s["generate_s"] < s["step_time_s"] for s in run["steps"]), run
        assert vs["summary"][trainer]["step_time_s_median"] > 0
    assert vs["summary"]["step_time_ratio_ragrl_to_trl"] > 0

    gen = report["parts"]["generation"]
    assert [b["batch"] for b in gen["batches"]] == [4, 8]
    assert all(b["tokens_per_s"] > 0 and b["decode_ms_per_step"] > 0 for b in gen["batches"]), gen
