"""The centre's local transport: versioned JSON requests over a Unix domain socket.

One allocator serves every user of a machine (issue 23), so it must know who asks
without trusting what they say. The server learns each peer's uid, gid and pid from the
kernel (``SO_PEERCRED``) when the peer connects, and names it from the password database;
nothing in a message can claim an identity. There is no TCP: only a socket file in a
directory the centre owns, that nobody else can write (so nobody can put another socket
in its place).

Wire format, both ways: a 4-byte big-endian length, then that many bytes of UTF-8 JSON.
A request is ``{"v": 1, "kind": "<name>", "body": {...}}``; a reply is
``{"v": 1, "ok": true, "body": {...}}`` or ``{"v": 1, "ok": false, "error": "<one line>"}``.
A connection may carry several requests, one at a time.

What the server drops, each with one log line, closing that connection and serving the
others: a peer uid with no account, a message over ``max_message_bytes``, one that is
not JSON or not such an object, one of another protocol version, a peer that stalls in
the middle of a message, and requests past a uid's rate (a token bucket per uid; the
log says so once per ``RATE_LOG_EVERY_S`` while the flood lasts; so it does of a uid's
malformed messages and of its connections past the cap, with how many went unlogged). A
handler that raises :class:`RequestRefused` sends its one-line reason; any other
exception is logged and answered ``internal error``: never a crash.

Use::

    server = Server(socket_dir, handler)   # handler(peer, request) -> reply body
    server.start()                         # refuses a bad directory or a live socket
    ...
    reply = call(server.path, "status", {"trainer": "t0001"})
    server.close()
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pwd
import socket
import stat
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bftrainer.service.reading import OUTCOMES

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
SOCKET_NAME = "centre.sock"
ENV_SOCKET_DIR = "BFTRAINER_SOCKET_DIR"
# A request or reply is small (a trainer's spec, a status table): 1 MiB is ample, and
# caps what one peer can make the server hold.
MAX_MESSAGE_BYTES = 1 << 20
# A peer has this long to send the rest of a message once it started one.
MESSAGE_TIMEOUT_S = 5.0
# Per uid: a burst of this many requests, refilled at this rate.
RATE_BURST = 50
RATE_PER_S = 20.0
RATE_LOG_EVERY_S = 10.0
# Connections open at once, per uid and in all: a peer cannot exhaust threads.
MAX_CONNECTIONS_PER_UID = 16
MAX_CONNECTIONS = 256
KIND_MAX_CHARS = 64
_HEADER = struct.Struct(">I")


class TransportError(OSError):
    """The transport cannot be used as asked; the message names the path and why."""


class RequestRefused(Exception):
    """Raised by a handler: the request is refused with this one-line reason."""


class ProtocolError(ValueError):
    """A message broke the wire format (the reason is one line)."""


@dataclass(frozen=True)
class Peer:
    """Who is on the other end, as the kernel says (``SO_PEERCRED``)."""

    uid: int
    gid: int
    pid: int
    user: str


@dataclass(frozen=True)
class Request:
    kind: str
    body: Mapping[str, Any]


Handler = Callable[[Peer, Request], Mapping[str, Any]]


# ---------------------------------------------------------------------- framing


def encode(message: Mapping[str, Any], max_bytes: int = MAX_MESSAGE_BYTES) -> bytes:
    data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > max_bytes:
        raise ProtocolError(f"message of {len(data)} bytes, over the limit of {max_bytes}")
    return _HEADER.pack(len(data)) + data


def read_message(sock: socket.socket, max_bytes: int, timeout_s: float | None) -> Any | None:
    """One message's JSON value; None if the peer closed before a new message.

    Waits without limit for a message to start (or ``timeout_s`` when given), then gives
    the rest ``MESSAGE_TIMEOUT_S``: a peer that stalls mid-message is dropped.
    """
    sock.settimeout(timeout_s)
    header = _read_exactly(sock, _HEADER.size, allow_eof=True)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > max_bytes:
        raise ProtocolError(f"message of {size} bytes announced, over the limit of {max_bytes}")
    sock.settimeout(MESSAGE_TIMEOUT_S)
    data = _read_exactly(sock, size, allow_eof=False) or b""
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:  # arrays or objects nested deeper than Python's stack
        raise ProtocolError("JSON nested too deep") from None
    except ValueError as e:  # not JSON, not UTF-8, or an integer of over 4,300 digits
        raise ProtocolError(f"not UTF-8 JSON ({type(e).__name__}: {str(e)[:200]})") from None


def _read_exactly(sock: socket.socket, n: int, *, allow_eof: bool) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError:
            if not buf and allow_eof:
                raise
            raise ProtocolError(
                f"stalled mid-message ({len(buf)} of {n} bytes in {MESSAGE_TIMEOUT_S:g} s)"
            ) from None
        if not chunk:
            if not buf and allow_eof:
                return None
            raise ProtocolError(f"closed mid-message ({len(buf)} of {n} bytes)")
        buf += chunk
    return bytes(buf)


def check_request(value: Any) -> Request:
    """The request in a decoded message, or :class:`ProtocolError` naming what is wrong."""
    if not isinstance(value, dict):
        raise ProtocolError(f"expected a JSON object, got {type(value).__name__}")
    version = value.get("v")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ProtocolError(f"no protocol version ('v' is {version!r:.40})")
    if version != PROTOCOL_VERSION:
        age = "an old" if version < PROTOCOL_VERSION else "a newer"
        raise ProtocolError(
            f"{age} protocol version {str(version)[:20]} (this server speaks {PROTOCOL_VERSION}): "
            "use the bftrainer of the centre's version"
        )
    unknown = set(value) - {"v", "kind", "body"}
    if unknown:
        raise ProtocolError(f"unknown field {sorted(unknown)[0]!r}")
    kind = value.get("kind")
    if not isinstance(kind, str) or not kind or len(kind) > KIND_MAX_CHARS:
        raise ProtocolError(f"'kind' is {str(kind)[:KIND_MAX_CHARS]!r}, expected a name")
    body = value.get("body", {})
    if not isinstance(body, dict):
        raise ProtocolError(f"'body' is a {type(body).__name__}, expected an object")
    return Request(kind, body)


# ---------------------------------------------------------------------- identity


def peer_of(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected, from the kernel."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return pid, uid, gid


def check_socket_dir(path: Path) -> None:
    """Refuse a socket directory someone else could write: whoever can write it can
    replace the socket and hear every user's requests."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        raise TransportError(f"socket directory {path} does not exist") from None
    if not stat.S_ISDIR(st.st_mode):
        raise TransportError(f"socket directory {path} is not a directory")
    if st.st_uid not in (0, os.geteuid()):
        raise TransportError(
            f"socket directory {path} belongs to uid {st.st_uid}, not to root or to the "
            f"allocator's account (uid {os.geteuid()})"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise TransportError(
            f"socket directory {path} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):o}): make it 0755 (chmod go-w)"
        )


# ---------------------------------------------------------------------- server


@dataclass
class _Bucket:
    tokens: float
    at_s: float


@dataclass
class Server:
    """Serves ``handler`` on ``socket_dir/SOCKET_NAME`` to any local user; see the module
    docstring. ``start`` binds and returns; requests run on one thread per connection."""

    socket_dir: Path
    handler: Handler
    socket_name: str = SOCKET_NAME
    max_message_bytes: int = MAX_MESSAGE_BYTES
    rate_burst: int = RATE_BURST
    rate_per_s: float = RATE_PER_S
    _listener: socket.socket | None = field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _buckets: dict[int, _Bucket] = field(default_factory=dict, init=False, repr=False)
    # (uid, kind of drop) -> when last logged, how many unlogged since (_warn_now_and_then)
    _warned: dict[tuple[int, str], tuple[float, int]] = field(
        default_factory=dict, init=False, repr=False
    )
    _open: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    _conns: set[socket.socket] = field(default_factory=set, init=False, repr=False)
    _closing: bool = field(default=False, init=False, repr=False)
    _outcomes: Counter[str] = field(default_factory=Counter, init=False, repr=False)

    @property
    def path(self) -> Path:
        return self.socket_dir / self.socket_name

    def start(self) -> Server:
        check_socket_dir(self.socket_dir)
        self._clear_stale_socket()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Every local user may connect (who they are comes from the kernel); the
            # directory, not the socket's mode, keeps others from replacing it.
            old = os.umask(0o111)
            try:
                listener.bind(os.fspath(self.path))
            finally:
                os.umask(old)
            listener.listen(64)
        except OSError as e:
            listener.close()
            raise TransportError(f"cannot serve on {self.path}: {e.strerror or e}") from None
        self._listener = listener
        self._thread = threading.Thread(target=self._accept_loop, name="centre-accept", daemon=True)
        self._thread.start()
        log.info("serving on %s", self.path)
        return self

    def _clear_stale_socket(self) -> None:
        try:
            st = self.path.lstat()
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise TransportError(
                f"{self.path} exists and is not a socket: move it away (the allocator does "
                "not delete what it did not make)"
            )
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(os.fspath(self.path))
        except (ConnectionRefusedError, FileNotFoundError):
            log.info("removing the stale socket %s (no server behind it)", self.path)
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            return
        finally:
            probe.close()
        raise TransportError(f"another allocator is serving on {self.path}")

    def close(self) -> None:
        """Stop accepting, close every connection, remove the socket."""
        self._closing = True
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def outcomes(self) -> dict[str, int]:
        """How many requests (or connections) ended in each of ``OUTCOMES`` so far."""
        with self._lock:
            return {k: self._outcomes[k] for k in OUTCOMES}

    def _count(self, outcome: str) -> None:
        with self._lock:
            self._outcomes[outcome] += 1

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._closing:
            try:
                conn, _ = listener.accept()
            except OSError:
                if self._closing:
                    return
                log.exception("accept failed on %s", self.path)
                time.sleep(0.1)
                continue
            try:
                pid, uid, gid = peer_of(conn)
            except OSError as e:
                log.warning("dropped a connection whose credentials cannot be read: %s", e)
                self._count("no_credentials")
                conn.close()
                continue
            with self._lock:
                too_many = (
                    len(self._conns) >= MAX_CONNECTIONS
                    or self._open.get(uid, 0) >= MAX_CONNECTIONS_PER_UID
                )
                if not too_many:
                    self._conns.add(conn)
                    self._open[uid] = self._open.get(uid, 0) + 1
            if too_many:
                self._warn_now_and_then(
                    uid,
                    "connections",
                    f"uid {uid} (pid {pid}): too many connections open; dropped one",
                )
                self._count("too_many_connections")
                conn.close()
                continue
            threading.Thread(
                target=self._serve, args=(conn, pid, uid, gid), name=f"centre-uid{uid}", daemon=True
            ).start()

    def _serve(self, conn: socket.socket, pid: int, uid: int, gid: int) -> None:
        try:
            try:
                user = pwd.getpwuid(uid).pw_name
            except KeyError:
                log.warning("uid %d (pid %d) has no account on this machine: refused", uid, pid)
                self._count("no_account")
                return
            peer = Peer(uid=uid, gid=gid, pid=pid, user=user)
            while not self._closing:
                try:
                    value = read_message(conn, self.max_message_bytes, None)
                except ProtocolError as e:
                    self._warn_now_and_then(uid, "malformed", f"{_who(peer)}: dropped: {e}")
                    self._count("malformed")
                    return
                except OSError:
                    return  # reset by the peer, or closed by close()
                if value is None:
                    return
                if not self._admit(peer):
                    self._count("rate_limited")
                    return
                try:
                    request = check_request(value)
                except ProtocolError as e:
                    self._warn_now_and_then(uid, "malformed", f"{_who(peer)}: dropped: {e}")
                    self._count("malformed")
                    return
                reply = self._handle(peer, request)
                try:
                    conn.sendall(reply)
                except OSError:
                    return
        finally:
            with self._lock:
                self._conns.discard(conn)
                self._open[uid] = self._open.get(uid, 1) - 1
            conn.close()

    def _handle(self, peer: Peer, request: Request) -> bytes:
        try:
            body = self.handler(peer, request)
            reply = encode({"v": PROTOCOL_VERSION, "ok": True, "body": dict(body)})
        except RequestRefused as e:
            reason = " ".join(str(e).split())
            log.info("%s: %r refused: %s", _who(peer), request.kind, reason)
            self._count("refused")
            return encode({"v": PROTOCOL_VERSION, "ok": False, "error": reason})
        except Exception as e:
            log.error("%s: %r failed: %s: %s", _who(peer), request.kind, type(e).__name__, e)
            self._count("failed")
            return encode({"v": PROTOCOL_VERSION, "ok": False, "error": "internal error"})
        self._count("answered")
        return reply

    def _warn_now_and_then(self, uid: int, what: str, message: str) -> None:
        """Log ``message`` once per ``RATE_LOG_EVERY_S`` per uid and kind of drop, with
        how many like it went unlogged since: a peer that sends garbage or opens
        connections in a loop must not flood the centre's log (1,000 lines in 0.5 s)."""
        now = time.monotonic()
        with self._lock:
            last_s, unlogged = self._warned.get((uid, what), (-math.inf, 0))
            if now - last_s < RATE_LOG_EVERY_S:
                self._warned[(uid, what)] = (last_s, unlogged + 1)
                return
            self._warned[(uid, what)] = (now, 0)
        more = (
            f" (and {unlogged} more like it in the last {RATE_LOG_EVERY_S:g} s)" if unlogged else ""
        )
        log.warning("%s%s", message, more)

    def _admit(self, peer: Peer) -> bool:
        """The uid's token bucket: False (and the connection is closed) past its rate."""
        now = time.monotonic()
        with self._lock:
            b = self._buckets.get(peer.uid)
            if b is None:
                b = self._buckets[peer.uid] = _Bucket(float(self.rate_burst), now)
            b.tokens = min(float(self.rate_burst), b.tokens + (now - b.at_s) * self.rate_per_s)
            b.at_s = now
            if b.tokens >= 1.0:
                b.tokens -= 1.0
                return True
        self._warn_now_and_then(
            peer.uid,
            "rate",
            f"{_who(peer)}: over {self.rate_per_s:g} requests/s (burst {self.rate_burst}): "
            "dropped 1 request(s)",
        )
        return False


def _who(peer: Peer) -> str:
    return f"uid {peer.uid} ({peer.user}, pid {peer.pid})"


# ---------------------------------------------------------------------- client


def call(
    path: Path | str,
    kind: str,
    body: Mapping[str, Any] | None = None,
    *,
    timeout_s: float = 30.0,
    server_uid: int | None = None,
) -> dict[str, Any]:
    """Send one request and return the reply's body.

    Raises :class:`TransportError` when the socket cannot be used (the path is missing,
    not a socket, nobody serves it, the server is not ``server_uid``, the connection
    dropped) and :class:`RequestRefused` with the server's reason.
    """
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise TransportError(
            f"{path}: no allocator socket there (is the centre's allocator running?)"
        ) from None
    if not stat.S_ISSOCK(st.st_mode):
        raise TransportError(f"{path} is not a socket")
    message = encode({"v": PROTOCOL_VERSION, "kind": kind, "body": dict(body or {})})
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(os.fspath(path))
        except ConnectionRefusedError:
            raise TransportError(f"{path}: nobody serves this socket (a stale one?)") from None
        except OSError as e:
            raise TransportError(f"{path}: cannot connect: {e.strerror or e}") from None
        if server_uid is not None:
            _, uid, _ = peer_of(sock)
            if uid != server_uid:
                raise TransportError(f"{path} is served by uid {uid}, not uid {server_uid}")
        try:
            sock.sendall(message)
            reply = read_message(sock, MAX_MESSAGE_BYTES, timeout_s)
        except (BrokenPipeError, ConnectionResetError):
            reply = None  # it dropped the request before reading all of it
        except (OSError, ProtocolError) as e:
            raise TransportError(f"{path}: the connection failed: {e}") from None
    if reply is None:
        raise TransportError(
            f"{path}: the allocator closed the connection without a reply (its log says why)"
        )
    if not isinstance(reply, dict) or reply.get("v") != PROTOCOL_VERSION:
        raise TransportError(f"{path}: a reply this client does not understand: {reply!r:.200}")
    if not reply.get("ok"):
        raise RequestRefused(str(reply.get("error", "refused")))
    body_out = reply.get("body", {})
    return body_out if isinstance(body_out, dict) else {}
