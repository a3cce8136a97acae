"""Run scheduler commands locally or on a login node over SSH, as argument lists.

A pool source never builds a shell string: it passes ``argv`` (and optional environment
variables) to a ``CommandRunner``. ``LocalRunner`` runs them with ``subprocess`` (no
shell); ``SshRunner`` sends them over SSH (paramiko) with every argument quoted, since
the remote side always goes through the login shell. Both apply a per-command timeout and
a bounded number of retries with backoff, and return a typed ``CommandResult`` or raise a
``CommandError`` subclass that names the command.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from bftrainer.common.names import check_host

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger(__name__)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAX_SHOWN_CHARS = 200


@dataclass(frozen=True)
class CommandResult:
    """What one run of a command gave back (the last attempt when it was retried)."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float
    attempts: int = 1

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


class CommandError(Exception):
    """A command could not give a usable reply; ``argv`` and ``where`` name it."""

    def __init__(self, argv: Sequence[str], where: str, problem: str) -> None:
        self.argv = tuple(argv)
        self.where = where
        self.problem = problem
        super().__init__(f"{shlex.join(self.argv)} ({where}): {problem}")


class CommandFailedError(CommandError):
    """The command ran and exited non-zero; ``result`` holds its output."""

    def __init__(self, result: CommandResult, where: str) -> None:
        self.result = result
        detail = _first_line(result.stderr) or _first_line(result.stdout) or "no output"
        super().__init__(result.argv, where, f"exit code {result.returncode}: {detail}")


class CommandTimeoutError(CommandError):
    """The command did not finish within its timeout and was stopped."""

    def __init__(self, argv: Sequence[str], where: str, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        super().__init__(argv, where, f"timed out after {timeout_s:g} s")


class CommandStartError(CommandError):
    """The command could not be started: missing program, or no SSH connection."""


class HostKeyError(CommandStartError):
    """The SSH server's host key is unknown or does not match known_hosts."""


class ProgramNotFoundError(CommandStartError):
    """The program (``argv[0]``) does not exist where the command runs."""


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= _MAX_SHOWN_CHARS else line[:_MAX_SHOWN_CHARS] + "..."
    return ""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries: ``attempts`` tries in all, sleeping ``backoff_s`` * ``factor``**k.

    Timeouts, non-zero exits and lost connections are retried (a busy controller answers
    "Socket timed out" one moment and works the next); a missing program or a rejected
    host key is not, since trying again cannot fix it.
    """

    attempts: int = 2
    backoff_s: float = 1.0
    factor: float = 2.0
    max_backoff_s: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")
        if self.backoff_s < 0 or self.factor < 1:
            raise ValueError(
                "RetryPolicy needs backoff_s >= 0 and factor >= 1, "
                f"got backoff_s={self.backoff_s}, factor={self.factor}"
            )

    def delay_s(self, retry: int) -> float:
        """Sleep before retry number ``retry`` (1 = the first retry)."""
        return min(self.max_backoff_s, self.backoff_s * self.factor ** (retry - 1))


NO_RETRY = RetryPolicy(attempts=1)


def _check_argv(argv: Sequence[str]) -> tuple[str, ...]:
    if isinstance(argv, str):
        raise TypeError(f"argv must be a list of arguments, not the string {argv!r}")
    args = tuple(argv)
    if not args:
        raise ValueError("argv is empty")
    for a in args:
        if not isinstance(a, str):
            raise TypeError(f"argument {a!r} of {args!r} is not a string")
        if "\0" in a:
            raise ValueError(f"argument {a!r} of {args!r} contains a NUL byte")
    return args


def _check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    out = dict(env or {})
    for k, v in out.items():
        if not _ENV_NAME.match(k):
            raise ValueError(f"bad environment variable name {k!r}")
        if "\0" in v:
            raise ValueError(f"environment variable {k} contains a NUL byte")
    return out


# A command's timeout, at most: subprocess's wait overflows near 1e10 s (a traceback),
# and a scheduler command that may take more than a day is a hang.
MAX_TIMEOUT_S = 86_400.0


class CommandRunner(ABC):
    """Runs one command (an argument list) with a timeout and bounded retries."""

    def __init__(
        self,
        *,
        timeout_s: float = 30.0,
        retry: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not 0 < timeout_s <= MAX_TIMEOUT_S:  # NaN too
            raise ValueError(f"timeout_s must be > 0 and <= {MAX_TIMEOUT_S:g}, got {timeout_s}")
        self.timeout_s = timeout_s
        self.retry = retry
        self._sleep = sleep

    @property
    @abstractmethod
    def where(self) -> str:
        """Where commands run, for messages: ``local`` or ``ssh user@host:port``."""

    def env_value(self, name: str) -> str | None:
        """A variable of the commands' environment, as far as this runner knows it."""
        return None

    def missing(self, programs: Sequence[str], files: Sequence[str]) -> list[str]:
        """What is known to be absent: programs not on PATH, files that cannot be read.
        Only a runner that can look cheaply says anything (the local one)."""
        return []

    @abstractmethod
    def _run_once(
        self, argv: tuple[str, ...], env: dict[str, str], timeout_s: float
    ) -> CommandResult:
        """One attempt: a result (any exit code) or a CommandError."""

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        check: bool = True,
    ) -> CommandResult:
        """Run ``argv``; retry transient failures; raise ``CommandError`` when all fail.

        ``env`` adds variables to the command's environment. With ``check=False`` a
        non-zero exit is returned (after the retries) instead of raised.
        """
        args = _check_argv(argv)
        extra = _check_env(env)
        limit_s = self.timeout_s if timeout_s is None else timeout_s
        last: CommandError | None = None
        result: CommandResult | None = None
        for attempt in range(1, self.retry.attempts + 1):
            if attempt > 1:
                delay = self.retry.delay_s(attempt - 1)
                log.debug("retrying %s in %.1f s after: %s", shlex.join(args), delay, last)
                self._sleep(delay)
            try:
                result = self._run_once(args, extra, limit_s)
            except (HostKeyError, ProgramNotFoundError):
                raise  # retrying cannot help
            except CommandError as exc:
                last = exc
                continue
            result = CommandResult(
                result.argv, result.returncode, result.stdout, result.stderr,
                result.duration_s, attempt,
            )  # fmt: skip
            if result.returncode == 0:
                return result
            last = CommandFailedError(result, self.where)
        if result is not None and not check and isinstance(last, CommandFailedError):
            return result
        assert last is not None
        raise last

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to free by default
        """Free connections; the runner may be used again afterwards (it reconnects)."""

    def __enter__(self) -> CommandRunner:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class LocalRunner(CommandRunner):
    """Runs commands on this machine with ``subprocess`` and no shell."""

    def __init__(
        self,
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        retry: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(timeout_s=timeout_s, retry=retry, sleep=sleep)
        self.env = _check_env(env)

    @property
    def where(self) -> str:
        return "local"

    def env_value(self, name: str) -> str | None:
        return self.env.get(name, os.environ.get(name))

    def missing(self, programs: Sequence[str], files: Sequence[str]) -> list[str]:
        path = self.env_value("PATH")
        problems = [
            f"{p} is not on PATH ({path})" for p in programs if not shutil.which(p, path=path)
        ]
        for f in files:
            if not os.path.isfile(f):
                problems.append(
                    f"{f} does not exist" if not os.path.exists(f) else f"{f} is not a file"
                )
            elif not os.access(f, os.R_OK):
                problems.append(f"{f} is not readable")
        return problems

    def _run_once(
        self, argv: tuple[str, ...], env: dict[str, str], timeout_s: float
    ) -> CommandResult:
        full_env = {**os.environ, **self.env, **env}
        start = time.monotonic()
        try:
            done = subprocess.run(
                argv,
                env=full_env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise CommandTimeoutError(argv, self.where, timeout_s) from None
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            raise ProgramNotFoundError(
                argv, self.where, f"cannot run {argv[0]}: {exc.strerror or exc}"
            ) from None
        return CommandResult(
            argv, done.returncode, done.stdout, done.stderr, time.monotonic() - start
        )


@dataclass(frozen=True)
class SshTarget:
    """``user@host[:port]`` as given to ``--ssh``."""

    user: str
    host: str
    port: int = 22

    @classmethod
    def parse(cls, text: str) -> SshTarget:
        m = re.fullmatch(r"(?:([^@\s:]+)@)?(\[[^\]]+\]|[^@\s:\[\]]+)(?::(\d+))?", text.strip())
        if not m:
            raise ValueError(f"bad SSH target {text!r} (expected user@host or user@host:port)")
        user = m.group(1) or os.environ.get("USER") or "root"
        host = m.group(2).strip("[]")
        if user.startswith("-"):
            raise ValueError(f"bad SSH user {user!r} in {text!r}: it starts with '-'")
        if not m.group(2).startswith("["):  # an IPv6 address in brackets is left as given
            check_host(host, f"SSH target {text!r}")
        port = int(m.group(3) or 22)
        if not 0 < port < 65536:
            raise ValueError(f"bad SSH port {port} in {text!r}")
        return cls(user, host, port)

    def __str__(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


@dataclass
class _Connection:
    client: paramiko.SSHClient | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class SshRunner(CommandRunner):
    """Runs commands on a login node over SSH (paramiko), connection kept and reused.

    Authentication is by key (``key_path``) and/or the SSH agent; the server's host key
    must be in ``known_hosts`` (default ``~/.ssh/known_hosts``): an unknown or changed
    key raises ``HostKeyError`` and is never accepted silently. On a timeout the channel
    is closed; the remote command gets no terminal, so it may run on to its own end.
    """

    def __init__(
        self,
        target: SshTarget | str,
        *,
        key_path: Path | None = None,
        known_hosts: Path | None = None,
        use_agent: bool = True,
        connect_timeout_s: float = 10.0,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        retry: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(timeout_s=timeout_s, retry=retry, sleep=sleep)
        self.target = target if isinstance(target, SshTarget) else SshTarget.parse(target)
        self.key_path = key_path
        self.known_hosts = known_hosts or Path.home() / ".ssh" / "known_hosts"
        self.use_agent = use_agent
        self.connect_timeout_s = connect_timeout_s
        self.env = _check_env(env)
        self._conn = _Connection()

    @property
    def where(self) -> str:
        return f"ssh {self.target}"

    def wire_command(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
        """The exact string sent to the server: every argument quoted, env via ``env``."""
        args = _check_argv(argv)
        merged = {**self.env, **_check_env(env)}
        prefix = ["env", *(f"{k}={v}" for k, v in merged.items())] if merged else []
        return shlex.join([*prefix, *args])

    def _client(self, argv: tuple[str, ...]) -> paramiko.SSHClient:
        import paramiko  # lazily: the CLI starts faster without it when SSH is not used

        if self._conn.client is not None:
            transport = self._conn.client.get_transport()
            if transport is not None and transport.is_active():
                return self._conn.client
            self.close()
        client = paramiko.SSHClient()
        if not self.known_hosts.exists():
            raise HostKeyError(
                argv, self.where, f"known_hosts file {self.known_hosts} does not exist"
            )
        try:
            client.load_host_keys(str(self.known_hosts))
        except (OSError, paramiko.SSHException) as exc:
            raise HostKeyError(
                argv, self.where, f"cannot read known_hosts {self.known_hosts}: {exc}"
            ) from None
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                self.target.host,
                port=self.target.port,
                username=self.target.user,
                key_filename=str(self.key_path) if self.key_path else None,
                allow_agent=self.use_agent,
                look_for_keys=self.key_path is None,
                timeout=self.connect_timeout_s,
                banner_timeout=self.connect_timeout_s,
                auth_timeout=self.connect_timeout_s,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError(
                argv, self.where, f"host key does not match {self.known_hosts}: {exc}"
            ) from None
        except paramiko.SSHException as exc:
            client.close()
            if "not found in known_hosts" in str(exc):
                raise HostKeyError(
                    argv, self.where, f"host key not in {self.known_hosts}: {exc}"
                ) from None
            raise CommandStartError(argv, self.where, f"SSH connection failed: {exc}") from None
        except (OSError, EOFError) as exc:
            client.close()
            raise CommandStartError(argv, self.where, f"cannot connect: {exc}") from None
        self._conn.client = client
        log.info("connected to %s", self.target)
        return client

    def _run_once(
        self, argv: tuple[str, ...], env: dict[str, str], timeout_s: float
    ) -> CommandResult:
        import paramiko

        wire = self.wire_command(argv, env)
        start = time.monotonic()
        with self._conn.lock:
            client = self._client(argv)
            try:
                transport = client.get_transport()
                if transport is None:
                    raise paramiko.SSHException("no transport")
                channel = transport.open_session(timeout=self.connect_timeout_s)
                channel.exec_command(wire)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self.close()
                raise CommandStartError(argv, self.where, f"SSH session failed: {exc}") from None
        return self._collect(channel, argv, start, timeout_s)

    def _collect(
        self, chan: paramiko.Channel, argv: tuple[str, ...], start: float, timeout_s: float
    ) -> CommandResult:
        out: list[bytes] = []
        err: list[bytes] = []
        chan.settimeout(0.1)
        deadline = start + timeout_s
        try:
            while True:
                got = False
                while chan.recv_ready():
                    out.append(chan.recv(65536))
                    got = True
                while chan.recv_stderr_ready():
                    err.append(chan.recv_stderr(65536))
                    got = True
                if (
                    chan.exit_status_ready()
                    and not chan.recv_ready()
                    and not chan.recv_stderr_ready()
                ):
                    break
                if time.monotonic() > deadline:
                    raise CommandTimeoutError(argv, self.where, timeout_s)
                if not got:
                    time.sleep(0.01)
            code = chan.recv_exit_status()
        except (OSError, EOFError) as exc:
            self.close()
            raise CommandStartError(argv, self.where, f"SSH connection lost: {exc}") from None
        finally:
            chan.close()
        return CommandResult(
            argv,
            code,
            b"".join(out).decode("utf-8", "replace"),
            b"".join(err).decode("utf-8", "replace"),
            time.monotonic() - start,
        )

    def close(self) -> None:
        client, self._conn.client = self._conn.client, None
        if client is not None:
            client.close()


class ReplayRunner(CommandRunner):
    """Answers commands from recorded outputs: for LSF, which cannot run here, and for
    replaying a scheduler's real failing replies in tests and demos.

    ``replies`` maps the program name (``argv[0]``, e.g. ``bhosts``) to a list of
    recorded results, given out in order; the last one repeats. A reply may also be a
    ``CommandError`` to raise (a timeout seen on the real system). Every call is kept in
    ``calls``.
    """

    def __init__(
        self,
        replies: Mapping[str, Sequence[CommandResult | CommandError]],
        *,
        timeout_s: float = 30.0,
        retry: RetryPolicy = NO_RETRY,
    ) -> None:
        super().__init__(timeout_s=timeout_s, retry=retry, sleep=lambda _s: None)
        self._replies = {k: list(v) for k, v in replies.items()}
        self._served: dict[str, int] = {}
        self.calls: list[tuple[tuple[str, ...], dict[str, str]]] = []

    @property
    def where(self) -> str:
        return "replay"

    def set_replies(self, program: str, replies: Sequence[CommandResult | CommandError]) -> None:
        self._replies[program] = list(replies)
        self._served[program] = 0

    def _run_once(
        self, argv: tuple[str, ...], env: dict[str, str], timeout_s: float
    ) -> CommandResult:
        self.calls.append((argv, env))
        program = os.path.basename(argv[0])
        replies = self._replies.get(program)
        if not replies:
            raise ProgramNotFoundError(argv, self.where, f"no recorded reply for {program}")
        i = self._served.get(program, 0)
        self._served[program] = i + 1
        reply = replies[min(i, len(replies) - 1)]
        if isinstance(reply, CommandError):
            raise reply
        return CommandResult(argv, reply.returncode, reply.stdout, reply.stderr, 0.0)


def recorded(stdout: str = "", stderr: str = "", returncode: int = 0) -> CommandResult:
    """A recorded reply for ``ReplayRunner`` (the argv is filled in when it is served)."""
    return CommandResult((), returncode, stdout, stderr, 0.0)
