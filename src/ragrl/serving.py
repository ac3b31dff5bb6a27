"""Model servers owned by the job that needs them: `with model_server(spec) as url: ...`.

A job that needs an OpenAI-compatible model (a teacher for SFT data, later judges, generators and
embedders) starts vLLM's server itself, inside its own allocation, and stops it when it is done.

Why a context manager in the job and not a Snakemake `service` / group job:
- the server must use the GPUs SLURM gave this job (CUDA_VISIBLE_DEVICES); a service job is a
  separate job with its own request, and group jobs share one allocation without splitting it;
- the consumer needs the server's URL, i.e. a port that is free on the node it landed on: known
  only at run time, in the job's own process, not in the DAG;
- stopping is tied to the job's own exit: `finally` stops the server by pid whether the body
  returned or raised; a SIGTERM to the job (Snakemake or scancel stopping it) becomes SystemExit
  while the server runs, so `finally` runs then too; and the kernel sends the server SIGTERM if
  the job dies without cleaning up (kill -9; PR_SET_PDEATHSIG). The same code runs under the
  local executor, SLURM and a hand-run `ragrl` command.
An external `base_url` in config skips all of this (`resolve_endpoint`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

from ragrl.errors import InputError

# The interpreter with vLLM installed: on a cluster the verl env has it (envs/verl.yaml), here
# .venv-vllm (scripts/vllm_venv.sh). The job's own python is the fallback.
PYTHON_ENV = "RAGRL_VLLM_PYTHON"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"


@dataclass(frozen=True)
class ServerSpec:
    """What to serve and how; `args` are passed to vLLM's server verbatim (e.g. --dtype,
    --tensor-parallel-size, --max-model-len)."""

    model: str
    served_name: str
    log: Path
    python: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 900.0
    host: str = "127.0.0.1"


class ServerStartError(RuntimeError):
    """The server exited or never answered /health; the message ends with its log's tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_python(spec: ServerSpec) -> str:
    return spec.python or os.environ.get(PYTHON_ENV) or sys.executable


def server_command(spec: ServerSpec, port: int) -> list[str]:
    return [server_python(spec), "-m", SERVER_MODULE, "--model", spec.model, "--served-model-name",
            spec.served_name, "--host", spec.host, "--port", str(port), *spec.args]


def server_env(spec: ServerSpec) -> dict[str, str]:
    """The job's environment minus this venv's Python settings (the server runs another interpreter),
    plus the spec's additions."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    env.update(spec.env)
    return env


def log_tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError as exc:
        return f"(no log: {exc})"


def stop_server(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM by pid (vLLM then stops its engine processes), SIGKILL if it hangs, then SIGKILL what
    is left of its process group: the server was started as a session leader, so the group is
    exactly its own processes and never the job's."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=grace_s)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _die_with_parent() -> None:
    """In the server's process before exec: SIGTERM it when the job that started it dies, so a
    job killed with SIGKILL leaves no server behind (Linux; elsewhere a no-op)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


@contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit meanwhile (main thread only: Python allows handlers nowhere else)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def poll_health(proc: subprocess.Popen, url: str, timeout_s: float) -> float | None:
    """Seconds until GET {url}/health answered 200; None if the process exited first;
    TimeoutError after `timeout_s`."""
    import httpx

    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            return None
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return time.monotonic() - start
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} not healthy after {timeout_s:.0f} s")


def wait_healthy(proc: subprocess.Popen, url: str, spec: ServerSpec) -> float:
    """Seconds until the server is healthy; ServerStartError, with its log, if it exits or times out."""
    try:
        seconds = poll_health(proc, url, spec.startup_timeout_s)
    except TimeoutError:
        raise ServerStartError(f"model server for {spec.model!r} not healthy after {spec.startup_timeout_s:.0f} s; "
                               f"log {spec.log}:\n{log_tail(spec.log)}") from None
    if seconds is None:
        raise ServerStartError(f"model server for {spec.model!r} exited with code {proc.returncode} during "
                               f"start-up; log {spec.log}:\n{log_tail(spec.log)}")
    return seconds


@contextmanager
def model_server(spec: ServerSpec) -> Iterator[str]:
    """Start vLLM's OpenAI-compatible server for `spec.model` on a free loopback port, wait for
    /health, yield its base URL, and stop it by pid on exit, whatever the body did.

    The log (spec.log) gets the command on its first line, then the server's output. A port taken
    between choosing and binding it shows as "address already in use": tried once more."""
    spec.log.parent.mkdir(parents=True, exist_ok=True)
    with _sigterm_as_exit():
        yield from _serve(spec)


def _serve(spec: ServerSpec) -> Iterator[str]:
    for attempt in range(2):
        port = free_port(spec.host)
        url = f"http://{spec.host}:{port}"
        cmd = server_command(spec, port)
        with open(spec.log, "w" if attempt == 0 else "a") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=server_env(spec), start_new_session=True,
                                    preexec_fn=_die_with_parent)
        try:
            startup_s = wait_healthy(proc, url, spec)
        except ServerStartError:
            stop_server(proc)
            if attempt == 0 and "address already in use" in log_tail(spec.log).lower():
                continue
            raise
        except BaseException:
            stop_server(proc)
            raise
        print(f"[serve] {spec.served_name} ({spec.model}) at {url}, pid {proc.pid}, healthy after "
              f"{startup_s:.1f} s; log {spec.log}", file=sys.stderr, flush=True)
        try:
            yield url
        finally:
            stop_server(proc)
            print(f"[serve] stopped {spec.served_name} (pid {proc.pid})", file=sys.stderr, flush=True)
        return


@contextmanager
def resolve_endpoint(base_url: str | None, spec: ServerSpec | None) -> Iterator[str]:
    """An external endpoint as given, else a server this job starts and stops."""
    if base_url:
        yield base_url
        return
    if spec is None:
        raise InputError("no base_url and nothing to serve")
    with model_server(spec) as url:
        yield url


# --------------------------------------------------------------------------- endpoints in options
# A method option may name an OpenAI-compatible endpoint (Method.endpoints): `{model, base_url?,
# serve?, api_key_env?}`. Without base_url, the job that needs it starts a server for it
# (`ragrl.stages.agent.served_endpoints`) and registers the URL here, under the model name it
# serves; the method reads it back with `endpoint_url`. The URL (a free port, new every run) stays
# out of the recipe, so it never changes the fingerprint a resumed job is checked against.
ENDPOINT_KEYS = {"model": str, "base_url": str, "serve": (bool, dict), "api_key_env": str}
_RUNNING: dict[str, str] = {}


def served_name(entry: Mapping) -> str:
    serve = entry.get("serve")
    return serve.get("served_name", entry["model"]) if isinstance(serve, dict) else entry["model"]


def check_endpoint(entry: Mapping, key: str) -> None:
    """An endpoint entry's keys and types; `key` names it in the error."""
    if not isinstance(entry, Mapping):
        raise InputError(f"{key}: expected a mapping {{model, base_url?, serve?, api_key_env?}}, got {entry!r}")
    for k, v in entry.items():
        if k not in ENDPOINT_KEYS:
            raise InputError(f"{key}.{k}: unknown setting; known: {sorted(ENDPOINT_KEYS)}")
        if not isinstance(v, ENDPOINT_KEYS[k]):
            raise InputError(f"{key}.{k}: wrong type {type(v).__name__}")
    if not entry.get("model"):
        raise InputError(f"{key}.model: the model the endpoint serves is required")
    if entry.get("base_url") and entry.get("serve"):
        raise InputError(f"{key}: base_url (an external endpoint) and serve (a server the job starts) exclude each other")
    if entry.get("serve") is False and not entry.get("base_url"):
        raise InputError(f"{key}.serve: false needs {key}.base_url (an external endpoint)")


@contextmanager
def registered_endpoint(name: str, url: str) -> Iterator[None]:
    _RUNNING[name] = url
    try:
        yield
    finally:
        _RUNNING.pop(name, None)


def api_key(entry: Mapping) -> str | None:
    """The API key an endpoint entry names by environment variable (`api_key_env`), if any."""
    return os.environ.get(entry["api_key_env"]) if entry.get("api_key_env") else None


def endpoint_url(entry: Mapping) -> tuple[str, str]:
    """(base URL, model name to request) of an endpoint entry: its base_url, or the server this
    job started for it."""
    if entry.get("base_url"):
        return entry["base_url"], entry["model"]
    name = served_name(entry)
    if name not in _RUNNING:
        raise RuntimeError(f"no server is running for endpoint model {name!r}: this job was to start it "
                           "(ragrl.stages.agent.served_endpoints), or give the entry a base_url")
    return _RUNNING[name], name
