"""The fork server runs `python -m ragrl` jobs as a fresh process would: same output, exit status,
working directory and environment; signals reach the job; a killed client takes its job down; and
whatever it cannot stand in for runs in the client's own process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragrl import forkserver

pytestmark = pytest.mark.integration

# A small preload: the behaviour under test does not depend on what is imported, and the server
# starts in seconds instead of importing torch.
PRELOAD = ("ragrl.cli", "ragrl.kg")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("forkserver")
    path = root / "s.sock"
    log = open(root / "server.log", "wb")
    code = ("import sys; from ragrl import forkserver; "
            f"job = forkserver.serve({str(path)!r}, preload={PRELOAD!r}); "
            "job is None or job.exit(job.run())")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=log, env=_env())
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, (root / "server.log").read_text()
        time.sleep(0.05)
    yield path, root / "server.log", proc
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


def _env(sock=None, **extra) -> dict[str, str]:
    """This process's environment, pointing at `sock` (or at no server)."""
    env = {k: v for k, v in os.environ.items() if k != forkserver.ENV}
    if sock is not None:
        env[forkserver.ENV] = str(sock)
    return {**env, **extra}


def _ragrl(args, cwd, sock=None, env_extra=None, **kw):
    env = _env(sock, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "ragrl", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, **kw)


def _served(log_path, before: int) -> int:
    """Jobs the server forked since `before` (its log names each child as it forks)."""
    return log_path.read_text().count("[forkserver] job ") - before


def _kg(tmp_path):
    d = tmp_path / "kg"
    d.mkdir()
    pq.write_table(pa.table({"head": ["Ada"], "relation": ["born_in"], "tail": ["London"]}), d / "triples.parquet")
    return d


def test_a_job_through_the_server_equals_the_same_job_run_directly(server, tmp_path):
    sock, log, _ = server
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # A user error: exit 2 and the message on stderr; the relative path resolves in the job's cwd.
    args = ["serve-kg", "--kg", "missing_dir", "--port", "0"]
    before = _served(log, 0)
    via = _ragrl(args, tmp_path / "a", sock)
    assert _served(log, before) == 1
    direct = _ragrl(args, tmp_path / "b")
    assert via.returncode == direct.returncode == 2
    assert via.stdout == direct.stdout and via.stderr == direct.stderr
    assert "missing_dir" in via.stderr
    # Another command's user error (no results database there): the same status, stdout and stderr.
    query = _ragrl(["query", "--db", str(tmp_path), "select 1"], tmp_path, sock)
    query_direct = _ragrl(["query", "--db", str(tmp_path), "select 1"], tmp_path)
    assert query.returncode == query_direct.returncode == 2
    assert (query.stdout, query.stderr) == (query_direct.stdout, query_direct.stderr)


def _tree(root):
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o777)
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_stage_writes_the_same_files_through_the_server(server, tmp_path):
    sock, log, _ = server
    before = _served(log, 0)
    runs = {}
    for name, via in (("via", sock), ("direct", None)):
        (tmp_path / name).mkdir()
        # The client's umask governs the job's files, as it would a fresh process's.
        out = subprocess.run(f"umask 077 && {sys.executable} -m ragrl world --seed 3 --size tiny --out w",
                             shell=True, cwd=tmp_path / name, env=_env(via), capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        runs[name] = _tree(tmp_path / name / "w")
    assert _served(log, before) == 1
    assert runs["via"] == runs["direct"] and runs["via"]
    assert {mode for _, mode in runs["via"].values()} == {0o600}


def test_the_job_sees_the_clients_environment_and_threads(server, tmp_path):
    sock, log, _ = server
    # The job's environment is the client's: a variable set for this command only reaches it.
    before = _served(log, 0)
    out = _ragrl(["--debug", "serve-kg", "--kg", "missing_dir", "--port", "0"], tmp_path, sock)
    out_env = _ragrl(["serve-kg", "--kg", "missing_dir", "--port", "0"], tmp_path, sock,
                     env_extra={"RAGRL_DEBUG": "1"})
    assert _served(log, before) == 2
    # RAGRL_DEBUG (read by the command, not at import) prints the traceback as --debug does.
    assert "Traceback" in out.stderr and "Traceback" in out_env.stderr
    # The child applies the job's thread count, as a fresh process reads OMP_NUM_THREADS (here
    # the function the child calls, in this process).
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    try:
        forkserver._set_threads({"OMP_NUM_THREADS": "1"})
        assert torch.get_num_threads() == 1
        forkserver._set_threads({"OMP_NUM_THREADS": "2,1"})  # nested: the first level
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(port: int, proc) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError("the KG server did not come up")


def _port_closed(port: int, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            time.sleep(0.1)
        except httpx.TransportError:
            return True
    return False


def _start_and_stop(tmp_path, signum, sock=None, log=None) -> tuple[int, int]:
    """A KG server job started through `sock` (or directly), stopped with `signum` once it serves:
    (its exit status, the jobs the server forked meanwhile)."""
    port = _free_port()
    before = _served(log, 0) if log else 0
    proc = subprocess.Popen([sys.executable, "-m", "ragrl", "serve-kg", "--kg", str(_kg(tmp_path)), "--port",
                             str(port)], cwd=tmp_path, env=_env(sock), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_up(port, proc)
    served = _served(log, before) if log else 0
    proc.send_signal(signum)
    code = proc.wait(timeout=30)
    assert _port_closed(port), "the job outlived its client"
    return code, served


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_stopping_the_client_stops_the_job(server, tmp_path, signum):
    sock, log, _ = server
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    code, served = _start_and_stop(tmp_path / "a", signum, sock, log)
    assert served == 1  # the server ran it, in a process that is not the client
    # SIGTERM is forwarded and the client ends as the job ended; SIGKILL ends the client, drops the
    # connection, and the server kills the job: either way the status a fresh process gives.
    direct, _ = _start_and_stop(tmp_path / "b", signum)
    assert code == direct


def test_what_the_server_cannot_stand_in_for_runs_in_the_client(server, tmp_path):
    sock, log, _ = server
    before = _served(log, 0)
    args = ["serve-kg", "--kg", "missing_dir", "--port", "0"]
    # An import-time variable that differs from the server's: declined, run here, same result.
    declined = _ragrl(args, tmp_path, sock, env_extra={"HF_HUB_DISABLE_TELEMETRY": "changed"})
    # No server at that path: run here.
    absent = _ragrl(args, tmp_path, tmp_path / "no.sock")
    assert declined.returncode == absent.returncode == 2 and "missing_dir" in declined.stderr
    assert _served(log, before) == 0


def test_a_malformed_request_is_refused_and_the_server_serves_on(server, tmp_path):
    sock, log, proc = server
    # Not JSON; a length of 2 GiB (refused at the header, not read); a request that is not an object;
    # JSON nested past the decoder's recursion limit (a RecursionError, not a ValueError, in json).
    deep = b"[" * 200_000
    for payload in (b"\x00\x00\x00\x05nope!", b"\x80\x00\x00\x00", b"\x00\x00\x00\x02[]",
                    forkserver._HEADER.pack(len(deep)) + deep):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(sock))
            s.sendall(payload)
            s.settimeout(15)
            answer = b"".join(iter(lambda: s.recv(4096), b""))  # until the server closes it
            assert b'"pid"' not in answer  # no job; at most a "declined"
    # A request from this interpreter, with descriptors and the server's environment, but no argv:
    # the server must refuse it, not fail on reading it.
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(sock))
        partial = {"cwd": str(tmp_path), "env": _env(), "path": sys.path, "umask": 0o022, "argv0": "x",
                   "executable": os.path.realpath(sys.executable), "prefix": sys.prefix}
        forkserver._send(s, partial, fds=[0, 1, 2])
        s.settimeout(15)
        answer = b"".join(iter(lambda: s.recv(4096), b""))
        assert b"malformed request" in answer
    ok = _ragrl(["serve-kg", "--kg", "missing_dir", "--port", "0"], tmp_path, sock)
    assert ok.returncode == 2 and proc.poll() is None


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has ended
    except FileNotFoundError:
        return True


def test_wrap_serves_the_command_and_the_server_ends_with_its_parent(tmp_path):
    log = tmp_path / "server.log"
    pidfile = tmp_path / "cmd.pid"
    # The wrapped command reports the socket it was given, then waits to be killed.
    cmd = f'echo "${forkserver.ENV}" > {tmp_path}/env.txt; echo $$ > {pidfile}; exec sleep 300'
    wrap = subprocess.Popen([sys.executable, "-m", "ragrl.forkserver", "wrap", "--log", str(log),
                             "--preload", ",".join(PRELOAD), "--",
                             "sh", "-c", cmd], env=_env())
    deadline = time.monotonic() + 120
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert wrap.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    first = log.read_text().splitlines()[0]  # "[forkserver] pid N listening on PATH (...)"
    server_pid, sock = int(first.split()[2]), first.split()[5]
    assert (tmp_path / "env.txt").read_text().strip() == sock and os.path.exists(sock)
    try:
        wrap.kill()
        wrap.wait(timeout=10)
        deadline = time.monotonic() + 15
        while not _gone(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(server_pid), "the server outlived its parent"
        assert not os.path.exists(sock)
    finally:
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
