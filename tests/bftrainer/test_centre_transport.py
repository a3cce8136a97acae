"""The centre's transport over real Unix sockets, with clients in real processes (and,
as root, under other real Unix accounts: one the test creates and deletes)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from bftrainer.centre import transport
from bftrainer.centre.transport import (
    PROTOCOL_VERSION,
    Peer,
    Request,
    RequestRefused,
    Server,
    TransportError,
    call,
)

IS_ROOT = os.geteuid() == 0
LOGGER = "bftrainer.centre.transport"


def handler(peer: Peer, request: Request) -> Mapping[str, Any]:
    if request.kind == "boom":
        raise RuntimeError("the handler broke")
    if request.kind == "refuse":
        raise RequestRefused("trainer t0002 belongs to another user")
    return {**request.body, "uid": peer.uid, "gid": peer.gid, "pid": peer.pid, "user": peer.user}


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A directory other accounts can reach (pytest's tmp_path is root's, mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="bft-centre-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def server(sock_dir: Path) -> Iterator[Server]:
    s = Server(sock_dir, handler).start()
    try:
        yield s
    finally:
        s.close()


CLIENT = (
    "import json, sys\n"
    "from bftrainer.centre.transport import call\n"
    "n = int(sys.argv[2])\n"
    "ok = errors = 0\n"
    "last = None\n"
    "for i in range(n):\n"
    "    try:\n"
    "        last = call(sys.argv[1], 'whoami', {'i': i})\n"
    "        ok += 1\n"
    "    except Exception as e:\n"
    "        errors += 1\n"
    "print(json.dumps({'ok': ok, 'errors': errors, 'last': last}))\n"
)


def run_client(path: Path, n: int = 1) -> tuple[int, dict[str, Any]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(path), str(n)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.pid, json.loads(out)


def call_as(
    uid: int, gid: int, path: Path, body: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``call`` from a forked process that dropped to ``uid``/``gid`` (the interpreter
    is already loaded, so the account needs no access to the virtualenv)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            try:
                reply = call(path, "whoami", body or {"from": "child"})
                result: dict[str, Any] = {"reply": reply}
            except Exception as e:
                result = {"error": f"{type(e).__name__}: {e}"}
            result["pid"] = os.getpid()
            os.write(write_fd, json.dumps(result).encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return dict(json.loads(data))


@contextlib.contextmanager
def throwaway_account() -> Iterator[pwd.struct_passwd]:
    name = f"bftc{os.getpid() % 100000}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def raw(path: Path, data: bytes) -> bytes:
    """Send bytes as they are; what comes back before the server closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def frame(value: object) -> bytes:
    data = json.dumps(value).encode()
    return struct.pack(">I", len(data)) + data


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= 30]


# ---------------------------------------------------------------------- identity


def test_a_client_process_is_known_by_its_kernel_credentials(server: Server) -> None:
    pid, out = run_client(server.path)
    assert out["ok"] == 1
    reply = out["last"]
    assert reply["uid"] == os.getuid() and reply["pid"] == pid
    assert reply["user"] == pwd.getpwuid(os.getuid()).pw_name
    assert reply["i"] == 0  # the body came through


@pytest.mark.skipif(not IS_ROOT, reason="connecting as another uid needs root")
def test_what_a_message_says_of_its_sender_does_not_count(server: Server) -> None:
    nobody = pwd.getpwnam("nobody")
    claim = {"uid": 0, "user": "root", "v_uid": 0}
    reply = call_as(nobody.pw_uid, nobody.pw_gid, server.path, claim)["reply"]
    assert (reply["uid"], reply["user"]) == (nobody.pw_uid, "nobody")


@pytest.mark.skipif(not IS_ROOT, reason="creating a Unix account needs root")
def test_a_second_real_account_is_seen_as_itself(server: Server) -> None:
    with throwaway_account() as account:
        result = call_as(account.pw_uid, account.pw_gid, server.path)
        reply = result["reply"]
        assert reply["uid"] == account.pw_uid != os.getuid()
        assert reply["user"] == account.pw_name
        assert reply["gid"] == account.pw_gid and reply["pid"] == result["pid"]
        assert reply["from"] == "child"
    with pytest.raises(KeyError):
        pwd.getpwnam(account.pw_name)  # deleted again


@pytest.mark.skipif(not IS_ROOT, reason="connecting as another uid needs root")
def test_a_peer_with_no_account_is_refused_in_one_line_and_others_are_served(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    uid = 54321
    while True:
        try:
            pwd.getpwuid(uid)
            uid += 1
        except KeyError:
            break
    result = call_as(uid, uid, server.path)
    assert "closed the connection without a reply" in result["error"]
    (line,) = warnings(caplog)
    assert line == f"uid {uid} (pid {result['pid']}) has no account on this machine: refused"
    assert call(server.path, "whoami")["uid"] == os.getuid()


# ---------------------------------------------------------------------- bad messages


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x00\x00\x00\x05hello", "not UTF-8 JSON"),
        (frame([1, 2]), "expected a JSON object, got list"),
        (frame({"kind": "status"}), "no protocol version ('v' is None)"),
        (
            frame({"v": 0, "kind": "status"}),
            f"an old protocol version 0 (this server speaks {PROTOCOL_VERSION})",
        ),
        (frame({"v": PROTOCOL_VERSION + 1, "kind": "status"}), "a newer protocol version"),
        (frame({"v": PROTOCOL_VERSION, "kind": ""}), "'kind' is '', expected a name"),
        (frame({"v": PROTOCOL_VERSION, "kind": "x", "body": []}), "'body' is a list"),
        (frame({"v": PROTOCOL_VERSION, "kind": "x", "as_uid": 0}), "unknown field 'as_uid'"),
        (struct.pack(">I", 64 << 20), "67108864 bytes announced, over the limit of 1048576"),
        (b"\x00\x00\x00\x10{}", "closed mid-message (2 of 16 bytes)"),
    ],
)
def test_a_bad_message_is_dropped_with_one_line_and_the_server_goes_on(
    server: Server, caplog: pytest.LogCaptureFixture, data: bytes, reason: str
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(server.path))
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)  # the "closed mid-message" case
        s.settimeout(10)
        assert s.recv(1024) == b""  # closed, no reply
    time.sleep(0.05)
    (line,) = warnings(caplog)
    assert reason in line and "dropped" in line and f"uid {os.getuid()}" in line
    assert call(server.path, "whoami")["uid"] == os.getuid()


def test_a_peer_that_stalls_mid_message_is_dropped(
    server: Server, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport, "MESSAGE_TIMEOUT_S", 0.2)
    caplog.set_level(logging.INFO, logger=LOGGER)
    assert raw(server.path, b"\x00\x00\x00\x10{") == b""
    (line,) = warnings(caplog)
    assert "stalled mid-message (1 of 16 bytes in 0.2 s)" in line


def test_a_handler_error_or_refusal_is_one_line_to_the_client(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    with pytest.raises(RequestRefused, match=r"^trainer t0002 belongs to another user$"):
        call(server.path, "refuse")
    with pytest.raises(RequestRefused, match=r"^internal error$"):
        call(server.path, "boom")
    (error,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert error.endswith(f"pid {os.getpid()}): 'boom' failed: RuntimeError: the handler broke")
    assert call(server.path, "whoami")["pid"] == os.getpid()


def test_several_requests_on_one_connection() -> None:
    # Framing both ways, without a server: encode then read back.
    a, b = socket.socketpair()
    with a, b:
        a.sendall(transport.encode({"v": 1, "kind": "x"}) + transport.encode({"v": 1, "kind": "y"}))
        a.shutdown(socket.SHUT_WR)
        kinds = []
        while (value := transport.read_message(b, 1024, 5)) is not None:
            kinds.append(transport.check_request(value).kind)
    assert kinds == ["x", "y"]


# ---------------------------------------------------------------------- floods


def test_a_flood_from_one_uid_is_rate_limited_with_one_line(
    sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    with Server(sock_dir, handler, rate_burst=10, rate_per_s=2.0) as s:
        t0 = time.monotonic()
        _, out = run_client(s.path, 200)
        elapsed = time.monotonic() - t0
        assert out["ok"] + out["errors"] == 200
        # The burst, plus what the rate refilled while the flood lasted.
        assert 10 <= out["ok"] <= 10 + 2.0 * elapsed + 1
        lines = [w for w in warnings(caplog) if "requests/s" in w]
        assert len(lines) == 1 and "over 2 requests/s (burst 10): dropped 1 request(s)" in lines[0]
        if IS_ROOT:  # another uid is not slowed by the flood
            nobody = pwd.getpwnam("nobody")
            assert call_as(nobody.pw_uid, nobody.pw_gid, s.path)["reply"]["user"] == "nobody"


# ---------------------------------------------------------------------- the socket's place


def test_a_socket_path_that_is_not_a_socket_is_refused(sock_dir: Path) -> None:
    (sock_dir / transport.SOCKET_NAME).write_text("not a socket")
    with pytest.raises(TransportError, match=r"centre\.sock exists and is not a socket"):
        Server(sock_dir, handler).start()
    assert (sock_dir / transport.SOCKET_NAME).read_text() == "not a socket"  # left alone
    with pytest.raises(TransportError, match=r"centre\.sock is not a socket$"):
        call(sock_dir / transport.SOCKET_NAME, "whoami")
    with pytest.raises(TransportError, match="no allocator socket there"):
        call(sock_dir / "missing.sock", "whoami")


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_a_socket_directory_others_can_write_is_refused(sock_dir: Path, mode: int) -> None:
    sock_dir.chmod(mode)
    with pytest.raises(TransportError, match=f"writable by group or others \\(mode {mode:o}\\)"):
        Server(sock_dir, handler).start()
    assert not (sock_dir / transport.SOCKET_NAME).exists()


def test_a_missing_or_foreign_directory_is_refused(sock_dir: Path) -> None:
    with pytest.raises(TransportError, match="does not exist"):
        Server(sock_dir / "nope", handler).start()
    if IS_ROOT:
        nobody = pwd.getpwnam("nobody")
        os.chown(sock_dir, nobody.pw_uid, nobody.pw_gid)
        with pytest.raises(TransportError, match=f"belongs to uid {nobody.pw_uid}"):
            Server(sock_dir, handler).start()


SERVE = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from bftrainer.centre.transport import Server\n"
    "Server(Path(sys.argv[1]), lambda peer, req: {'served_by': 'child'}).start()\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


def test_a_live_server_is_not_displaced_and_a_killed_ones_socket_is_reused(
    sock_dir: Path,
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(sock_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert call(sock_dir / transport.SOCKET_NAME, "x") == {"served_by": "child"}
        with pytest.raises(TransportError, match="another allocator is serving on"):
            Server(sock_dir, handler).start()
        os.kill(proc.pid, signal.SIGKILL)  # leaves its socket file behind
        proc.wait(timeout=30)
        assert (sock_dir / transport.SOCKET_NAME).is_socket()
        with Server(sock_dir, handler) as s:
            assert call(s.path, "whoami")["pid"] == os.getpid()
        assert not (sock_dir / transport.SOCKET_NAME).exists()  # close() removes it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
