"""The fork server's client and its wire protocol, against a peer that answers at once: however
fast the job ends, the client reports the job's own exit status and never runs the job itself."""

from __future__ import annotations

import array
import os
import signal
import socket
import threading
import time

import pytest

from ragrl import forkserver


def test_a_request_sent_whole_survives_the_server_answering_at_once():
    # The server may read a request, answer and close before the client's send returns (CI saw it):
    # the client must not then fail, for on failure it runs the job itself, a second time.
    client, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    class AnsweredAtOnce(socket.socket):
        def sendmsg(self, *args):
            sent = super().sendmsg(*args)
            message, fds = forkserver._recv(server_end, with_fds=True)
            for fd in fds:
                os.close(fd)
            forkserver._send(server_end, {"pid": 1, "argv": message["argv"]})
            server_end.close()
            return sent

    sock = AnsweredAtOnce(fileno=client.detach())
    forkserver._send(sock, {"argv": ["query"]}, fds=[0, 1, 2])
    assert forkserver._recv(sock)[0] == {"pid": 1, "argv": ["query"]}
    sock.close()


def test_messages_queued_together_are_read_one_at_a_time():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        forkserver._send(a, {"pid": 7})
        forkserver._send(a, {"status": 3})
        a.close()
        assert [forkserver._recv(b)[0] for _ in range(3)] == [{"pid": 7}, {"status": 3}, None]


def test_a_request_nested_past_the_json_depth_is_a_malformed_one_and_its_descriptors_are_closed():
    # json raises RecursionError there, which the server's accept loop would not catch: it must
    # come out as the ValueError every other unreadable request gives, with the fds closed.
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    r, w = os.pipe()
    pipe = os.readlink(f"/proc/self/fd/{w}")  # "pipe:[inode]", the same for both ends

    def ends_open() -> int:
        return sum(1 for fd in os.listdir("/proc/self/fd") if _link(fd) == pipe)

    with a, b:
        deep = b"[" * 20_000  # past the decoder's depth, and within one socket buffer
        a.sendmsg([forkserver._HEADER.pack(len(deep)) + deep],
                  [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r]))])
        os.close(r)
        with pytest.raises(ValueError, match="nested"):
            forkserver._recv(b, with_fds=True)
        assert ends_open() == 1  # w alone: the received copy of r was closed
    os.close(w)


def _link(fd: str) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def test_a_job_that_ends_before_the_client_reads_reports_its_own_status(tmp_path, monkeypatch):
    path = str(tmp_path / "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    received = []
    real_send = forkserver._send

    def fake_server():  # answers as the real one does for a job that exits with 3 at once
        conn, _ = listener.accept()
        with conn:
            request, fds = forkserver._recv(conn, with_fds=True)
            for fd in fds:
                os.close(fd)
            received.append(request["argv"])
            real_send(conn, {"pid": 999_999_999})
            real_send(conn, {"status": 3})

    def slow_client_send(sock, message, fds=None):  # both answers are queued before the first read
        real_send(sock, message, fds)
        time.sleep(0.3)

    thread = threading.Thread(target=fake_server)
    thread.start()
    monkeypatch.setenv(forkserver.ENV, path)
    monkeypatch.setattr(forkserver, "_send", slow_client_send)
    handlers = {signum: signal.getsignal(signum) for signum in forkserver._FORWARDED}
    try:
        status = forkserver.run_via_server(["query", "--help"])
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        thread.join(10)
        listener.close()
    # None would make the client run the job itself; 1 is "the server went away".
    assert status == 3 and received == [["query", "--help"]]
