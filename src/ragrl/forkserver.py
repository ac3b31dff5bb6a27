"""A pre-imported parent for `python -m ragrl` jobs on one machine (opt-in: RAGRL_FORKSERVER).

Why: a job that loads the policy spends ~6-8 s of CPU importing torch and transformers (whose
Qwen2 module pulls in torch.distributed.tensor, dynamo and scipy) before it does anything. The
embedded default's DAG runs 127 jobs (and servers some of them start), so on 2 cores import
alone was minutes of the DAG and of `make test`. The server imports those libraries once; each job
is a fork of it, and starts with them loaded.

A job is still one shell command: `python -m ragrl ...` finds RAGRL_FORKSERVER (a Unix socket
path) and sends its argv, working directory, environment, sys.path and its stdin/stdout/stderr
descriptors; the server forks, the child takes those over and runs the command, and the client
exits with the child's status (re-raising a signal that killed it). The client forwards SIGTERM,
SIGINT, SIGHUP and SIGQUIT to the child's process group, and the server kills that group when the
client's connection drops (the client was SIGKILLed), so Snakemake's and SLURM's ways of stopping
a job still stop it. Whenever the server cannot stand in for a fresh process, it declines and the
client runs the command itself: no server listening, another interpreter or venv (the vLLM and verl
venvs), or an environment variable that libraries read at import time (HF_*, TRANSFORMERS_*,
TORCH*, PYTHON*, ...) differing from the server's.

What differs from a fresh process, by design: the job's process is not a descendant of the shell
that ran it, so Snakemake's `benchmark:` files (and the `jobs` table) count only the client's
CPU time and memory, not the job's (run without the server to measure jobs); a job finds the
preloaded modules in the state their import left them (the server runs nothing else), and the hash
seed of `str` is the server's. Thread counts are taken from the job's OMP_NUM_THREADS, as a fresh process would.

Standard library only: the client path must stay as cheap as a bare `python` start.
"""

from __future__ import annotations

import array
import atexit
import gc
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from ragrl.jobenv import with_log_defaults

ENV = "RAGRL_FORKSERVER"
# Read by libraries when they are imported, so a job whose value differs from the server's would
# run with the server's: those jobs run on their own.
IMPORT_TIME_ENV_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH", "PYTORCH_",
                            "CUDA_", "NCCL_", "PYTHON", "LD_", "KMP_", "GOMP_", "DEEPSPEED_", "ACCELERATE_",
                            "TQDM_", "VIRTUAL_ENV", "ATEN_", "MKL_", "ONEDNN_", "DNNL_", "CUBLAS_")
# ... except these: the job's sys.path replaces the server's; torch sets the inductor cache dir in
# its own environment and reads it when compiling; the byte-code flag is applied in the job.
NOT_IMPORT_TIME = {"PYTHONPATH", "TORCHINDUCTOR_CACHE_DIR", "PYTHONDONTWRITEBYTECODE"}
# Modules a `ragrl` job typically imports before its work: what the server loads once.
PRELOAD = ("torch", "transformers", "transformers.models.qwen2.modeling_qwen2", "safetensors.torch",
           "accelerate", "trl", "peft", "datasets", "faiss", "numpy", "pyarrow.parquet", "polars",
           "duckdb", "httpx", "fastapi", "uvicorn", "ragrl.cli", "ragrl.train.sft", "ragrl.train.rl",
           "ragrl.agent.rollout", "ragrl.retrieval.encoder")
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_HEADER = struct.Struct("!I")
_MAX_MESSAGE = 64 << 20


def _import_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items()
            if k.startswith(IMPORT_TIME_ENV_PREFIXES) and k != ENV and k not in NOT_IMPORT_TIME}


def _identity() -> dict:
    return {"executable": os.path.realpath(sys.executable), "prefix": sys.prefix}


def _send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        sent = sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        payload = payload[sent:]
    if payload:  # sending nothing fails (EPIPE) once the server has answered and closed
        sock.sendall(payload)


def _recv(sock: socket.socket, with_fds: bool = False) -> tuple[dict | None, list[int]]:
    """One message (None at end of stream) and the descriptors that came with it.

    Never reads past the message: a job that ends at once has its pid and its status queued
    together, and the status must still be there for the next call."""
    fds: list[int] = []
    buf = b""
    if with_fds:
        item = array.array("i").itemsize
        buf, ancillary, _, _ = sock.recvmsg(_HEADER.size, socket.CMSG_SPACE(3 * item))
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", data[: len(data) - len(data) % item]))
    try:
        header = _read_up_to(sock, buf, _HEADER.size)
        if header is None:
            return None, fds
        (size,) = _HEADER.unpack(header)
        if size > _MAX_MESSAGE:
            raise ValueError(f"message of {size} bytes")
        body = _read_up_to(sock, b"", size)
        try:
            return (None if body is None else json.loads(body)), fds
        except RecursionError:  # JSON nested past the decoder's depth: malformed, not a reason to stop
            raise ValueError("message nested too deeply") from None
    except (OSError, ValueError):
        for fd in fds:  # a failed request's descriptors are never used
            os.close(fd)
        raise


def _read_up_to(sock: socket.socket, buf: bytes, size: int) -> bytes | None:
    """`buf` completed to `size` bytes from `sock`; None if the stream ends first."""
    while len(buf) < size:
        chunk = sock.recv(min(65536, size - len(buf)))
        if not chunk:
            return None
        buf += chunk
    return buf


# ----------------------------------------------------------------------------------------- client


def run_via_server(argv: list[str]) -> int | None:
    """Run `ragrl argv` in a fork of the server; None when there is no server or it declined."""
    path = os.environ.get(ENV)
    if not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        umask = os.umask(0o022)
        os.umask(umask)
        _send(sock, {"argv": argv, "argv0": sys.argv[0], "cwd": os.getcwd(), "env": dict(os.environ),
                     "path": sys.path, "umask": umask, **_identity()}, fds=[0, 1, 2])
        reply, _ = _recv(sock)
    except OSError:
        sock.close()
        return None
    if not reply or "pid" not in reply:
        sock.close()
        return None
    child = int(reply["pid"])

    def forward(signum, _frame):
        try:
            os.killpg(child, signum)
        except ProcessLookupError:
            pass

    for signum in _FORWARDED:
        signal.signal(signum, forward)
    reply, _ = _recv(sock)  # a forwarded signal interrupts the wait; Python resumes it (PEP 475)
    sock.close()
    if reply is None:
        print(f"ragrl: the fork server ({path}) went away while running the job", file=sys.stderr)
        return 1
    status = int(reply["status"])
    if status < 0:  # killed by a signal: end the same way, so the shell reports 128 + signal
        for signum in _FORWARDED:
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status


# ----------------------------------------------------------------------------------------- server


class _Job:
    """In the forked child: what the client sent, applied to this process."""

    def __init__(self, request: dict, fds: list[int]):
        self.request, self.fds = request, fds

    def run(self) -> int:
        for signum in (*_FORWARDED, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in zip((0, 1, 2), self.fds):
            os.dup2(fd, target)
        for fd in self.fds:
            if fd > 2:
                os.close(fd)
        request = self.request
        os.chdir(request["cwd"])
        os.umask(int(request.get("umask", 0o022)))
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = request["path"]
        sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
        sys.argv = [request.get("argv0", sys.argv[0]), *request["argv"]]
        for stream in (sys.stdout, sys.stderr):  # line-buffered on a terminal, as at a fresh start
            stream.reconfigure(line_buffering=stream.isatty() or stream is sys.stderr)
        _set_threads(os.environ)
        _reseed()
        from ragrl.cli import main

        try:
            return main(request["argv"])
        except SystemExit as exc:
            code = exc.code
            if code is None or isinstance(code, int):
                return code or 0
            print(code, file=sys.stderr)
            return 1
        except BaseException as exc:  # as the interpreter would: the traceback, then status 1 (or SIGINT)
            import traceback

            traceback.print_exc()
            return -signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1

    @staticmethod
    def exit(code: int) -> None:
        """End the job as the interpreter would, without tearing down the preloaded modules: their
        finalisation would touch, and so copy, most of the server's heap (over a second a job)."""
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code)


def _set_threads(env) -> None:
    # The first level of a nested-parallelism list ("2,1"), as OpenMP reads it; unset or unreadable:
    # every CPU this process may use, torch's own default.
    first = (env.get("OMP_NUM_THREADS") or "").split(",")[0].strip()
    n = (int(first) if first.isdigit() else 0) or len(os.sched_getaffinity(0))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
    if "faiss" in sys.modules:
        sys.modules["faiss"].omp_set_num_threads(n)


def _reseed() -> None:
    # A fresh process seeds these from the OS; every fork would otherwise share the server's state.
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


# What a request must hold, and of which type: the child reads every one of them.
_REQUEST = {"argv": list, "argv0": str, "cwd": str, "env": dict, "path": list, "umask": int,
            "executable": str, "prefix": str}


def _decline_reason(request, fds: list[int]) -> str | None:
    if (not isinstance(request, dict) or len(fds) != 3
            or any(not isinstance(request.get(k), t) for k, t in _REQUEST.items())
            or not all(isinstance(a, str) for a in request["argv"])):
        return "malformed request"
    if {k: request.get(k) for k in ("executable", "prefix")} != _identity():
        return "another interpreter"
    # Compared as the CLI will leave it, before anything is imported (ragrl.jobenv).
    theirs = _import_env(with_log_defaults(dict(request["env"]), os.isatty(fds[2])))
    ours = _import_env(dict(os.environ))
    differ = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k))
    if differ:
        return f"import-time environment differs: {', '.join(differ)}"
    return None


def serve(path: str | Path, preload: tuple[str, ...] = PRELOAD, ready_fd: int | None = None) -> _Job | None:
    """Listen on `path` until SIGTERM; returns only in a forked child, with the job to run."""
    import importlib

    owner, parent = os.getpid(), os.getppid()
    # Its jobs' stderr is a log file: the CLI's defaults for that, in place before the imports.
    os.environ.update(with_log_defaults(dict(os.environ), stderr_is_tty=False))
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # an optional extra not installed: its jobs import it themselves
            print(f"[forkserver] not preloaded: {name} ({exc})", file=sys.stderr, flush=True)
    # Out of the collector's reach: a collection in a child would touch (and so copy) every page of
    # the preloaded heap. Python's own advice for pre-fork servers (gc.freeze docs).
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    Path(path).unlink(missing_ok=True)
    listener.bind(str(path))
    listener.listen(64)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    print(f"[forkserver] pid {owner} listening on {path} ({len(sys.modules)} modules loaded)",
          file=sys.stderr, flush=True)
    if ready_fd is not None:
        os.write(ready_fd, b"ready\n")
        os.close(ready_fd)
    children: dict[int, socket.socket] = {}  # pid -> the client's connection
    dropped: set[int] = set()  # children whose client went away (killed, not yet reaped)
    started = time.monotonic()
    served = 0
    try:
        # Ends with its parent (`wrap`, killed with -9 with the run): an orphaned server would
        # otherwise listen, and keep its jobs' processes, until the machine restarts.
        while not stopping and os.getppid() == parent:
            try:
                watched = [s for p, s in children.items() if p not in dropped]
                readable, _, _ = select.select([listener, *watched], [], [], 0.2)
            except InterruptedError:
                continue
            for sock in readable:
                if sock is listener:
                    before = len(children)
                    job = _accept(listener, children)
                    served += len(children) - before
                    if job is not None:  # the child
                        listener.close()
                        for other in children.values():
                            other.close()
                        return job
                else:  # a client's end of stream: it was killed; so is its job
                    pid = next(p for p, s in children.items() if s is sock)
                    _kill_group(pid, signal.SIGKILL)
                    dropped.add(pid)
            _reap(children)
            dropped &= children.keys()
    finally:
        if os.getpid() == owner:
            for pid in list(children):
                _kill_group(pid, signal.SIGTERM)
            listener.close()
            Path(path).unlink(missing_ok=True)
            print(f"[forkserver] stopped after {served} jobs in {time.monotonic() - started:.0f} s",
                  file=sys.stderr, flush=True)
    return None


def _accept(listener: socket.socket, children: dict[int, socket.socket]) -> _Job | None:
    conn, _ = listener.accept()
    conn.settimeout(10)  # a client that stalls mid-request must not stall the server
    request, fds, reason = None, [], None
    try:
        request, fds = _recv(conn, with_fds=True)
        reason = _decline_reason(request, fds)
    except (OSError, ValueError):  # _recv has closed the descriptors it received
        reason = "unreadable request"
    if reason:
        shown = " ".join(request["argv"])[:200] if reason != "malformed request" and request else ""
        print(f"[forkserver] declined ({reason}): ragrl {shown}", file=sys.stderr, flush=True)
        try:
            _send(conn, {"declined": reason})
        except OSError:
            pass
        conn.close()
        for fd in fds:
            os.close(fd)
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    conn.settimeout(None)
    pid = os.fork()
    if pid == 0:
        os.setsid()  # its own process group: the client's signals reach the job's children too
        conn.close()
        return _Job(request, fds)
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    try:  # the pid first: a client without it takes the job for declined and runs it itself
        _send(conn, {"pid": pid})
    except OSError:
        _kill_group(pid, signal.SIGKILL)
    print(f"[forkserver] job {pid}: ragrl {' '.join(request['argv'])[:300]} (cwd {request['cwd']})",
          file=sys.stderr, flush=True)
    return None


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        try:
            _send(conn, {"status": code})
        except OSError:
            pass
        conn.close()


def _kill_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


# ------------------------------------------------------------------------------- wrapping a command


def run_with_server(command: list[str], log: str | Path, preload: tuple[str, ...] = PRELOAD) -> int:
    """Start a server, run `command` with RAGRL_FORKSERVER pointing at it, stop the server."""
    import shutil
    import tempfile

    Path(log).parent.mkdir(parents=True, exist_ok=True)
    # A short path of its own: a Unix socket's path is limited to 107 bytes, deep checkouts exceed it.
    directory = tempfile.mkdtemp(prefix="ragrl-forkserver-")
    socket_path = os.path.join(directory, "s.sock")
    read_end, write_end = os.pipe()
    with open(log, "ab") as log_file:
        server = subprocess.Popen([sys.executable, "-m", "ragrl.forkserver", "serve", "--socket", socket_path,
                                   "--ready-fd", str(write_end), "--preload", ",".join(preload)],
                                  stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, pass_fds=(write_end,),
                                  env={k: v for k, v in os.environ.items() if k != ENV})
    os.close(write_end)
    with os.fdopen(read_end) as ready:
        up = ready.readline().strip() == "ready"
    env = dict(os.environ)
    if up:
        env[ENV] = socket_path
    else:
        print(f"ragrl.forkserver: the server did not start (see {log}); running without it", file=sys.stderr)
    try:
        return subprocess.call(command, env=env)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ragrl.forkserver", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve", help="listen on a socket until SIGTERM")
    serve_p.add_argument("--socket", required=True)
    serve_p.add_argument("--ready-fd", type=int, help="write 'ready' to this descriptor once listening")
    preload_help = "comma-separated modules to import before forking (default: what ragrl's jobs import)"
    serve_p.add_argument("--preload", default=",".join(PRELOAD), help=preload_help)
    wrap = sub.add_parser("wrap", help="run a command with a server beside it: wrap [--log F] -- cmd ...")
    wrap.add_argument("--log", default="logs/forkserver.log", help="the server's log (appended)")
    wrap.add_argument("--preload", default=",".join(PRELOAD), help=preload_help)
    wrap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "serve":
        os.environ.pop(ENV, None)
        job = serve(args.socket, preload=_modules(args.preload), ready_fd=args.ready_fd)
        if job is None:
            return 0
        job.exit(job.run())
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("wrap needs a command after --")
    return run_with_server(cmd, args.log, _modules(args.preload))


def _modules(text: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in text.split(",") if m.strip())


if __name__ == "__main__":
    sys.exit(main())
