"""The one check of the names and counts that reach a command line or a path.

A host name ends up as an argument of ``ssh``, ``srun -w`` or torchrun's rendezvous, a
trainer id as a folder name and a worker's identity, a slot count as the number of
processes started on a host. Each enters from text (a hosts file, an option, a
scheduler's reply, the store), so each is checked here, once, where it enters:

- a host name is letters, digits, ``_``, ``.`` and ``-``, not starting with ``-`` (ssh
  would read ``-oProxyCommand=...`` as an option) and never a path;
- a trainer id likewise (it names a folder: ``..`` or a ``/`` would leave it);
- a slot count is an integer from 1 to ``MAX_SLOTS`` (the documented maximum of
  ``--slots-per-node``), a node count from 1 to ``MAX_NODES``;
- text read from a file is UTF-8, or refused naming the file; a file read is a regular
  file, checked on the open file (a FIFO put in its place would block the reader).

Each refusal is a ``BadNameError`` (a ``ValueError``) whose message is one line naming
what is wrong and where it came from.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

MAX_HOST_CHARS = 253  # a DNS name's limit
MAX_ID_CHARS = 64
MAX_SLOTS = 1024
MAX_NODES = 1_000_000

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


class BadNameError(ValueError):
    """A host name, trainer id or count that cannot be used; names it and its origin."""


def _where(source: str) -> str:
    return f"{source}: " if source else ""


def check_host(host: str, source: str = "") -> str:
    """``host`` if it is a usable host name, else ``BadNameError``."""
    if not host:
        raise BadNameError(f"{_where(source)}empty host name")
    if host.startswith("-"):
        raise BadNameError(
            f"{_where(source)}host name {host!r} starts with '-' (it would be read as an option)"
        )
    if len(host) > MAX_HOST_CHARS or not _NAME.fullmatch(host):
        raise BadNameError(
            f"{_where(source)}bad host name {host[:80]!r}: expected letters, digits, '_', '.' "
            f"and '-' (at most {MAX_HOST_CHARS} characters)"
        )
    return host


def check_trainer_id(trainer_id: str, source: str = "") -> str:
    """``trainer_id`` if it can name a trainer (and its folder), else ``BadNameError``."""
    if (
        not trainer_id
        or len(trainer_id) > MAX_ID_CHARS
        or not _NAME.fullmatch(trainer_id)
        or set(trainer_id) == {"."}
    ):
        raise BadNameError(
            f"{_where(source)}bad trainer id {trainer_id[:80]!r}: expected letters, digits, "
            f"'_', '.' and '-', not starting with '-' or '.', at most {MAX_ID_CHARS} "
            "characters (it names a folder)"
        )
    return trainer_id


def trainer_id_from(stem: str) -> str:
    """A trainer id made from a script's name: what ``check_trainer_id`` refuses in it
    becomes ``-`` (``my train.py`` -> ``my-train``)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.\-]", "-", stem).lstrip("-.")[:MAX_ID_CHARS]
    return cleaned or "trainer"


def check_count(value: object, what: str, maximum: int, source: str = "") -> int:
    """``value`` (an int or its decimal text) as an int from 1 to ``maximum``."""
    text = str(value).strip()
    if isinstance(value, bool) or not re.fullmatch(r"[0-9]{1,100}", text):
        raise BadNameError(f"{_where(source)}{what} {text[:40]!r}: expected an integer")
    number = int(text)
    if not 1 <= number <= maximum:
        raise BadNameError(f"{_where(source)}{what} {number}: expected 1 to {maximum}")
    return number


def check_slots(value: object, source: str = "") -> int:
    """A host's slot count: 1 to ``MAX_SLOTS``."""
    return check_count(value, "slot count", MAX_SLOTS, source)


def decode_text(data: bytes, path: Path | str) -> str:
    """``data`` read from ``path`` as UTF-8; ``BadNameError`` naming the file and the
    first bad byte's offset otherwise."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadNameError(
            f"{path}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})"
        ) from None


class NotRegularFileError(OSError):
    """A path that is read as a file is a FIFO, a device, a socket or a folder."""


def not_regular(path: Path | str, mode: int) -> str:
    """The one line that refuses ``path`` (of ``st_mode`` ``mode``, not a regular file)
    as an input: what it is instead."""
    if stat.S_ISDIR(mode):
        kind = "a folder"
    elif stat.S_ISFIFO(mode):
        kind = "a FIFO"
    else:
        kind = "a device or socket"
    return f"{path} is {kind}, not a regular file"


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading in binary, if it is a regular file; else
    ``NotRegularFileError`` naming it and what it is. Opened without blocking and
    checked on the open file, so a FIFO swapped in after a look never hangs the reader."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(errno.EINVAL, not_regular(path, mode), str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: Path) -> bytes:
    """The bytes of the regular file ``path`` (``NotRegularFileError`` otherwise)."""
    with open_regular(path) as f:
        return f.read()


def read_text(path: Path) -> str:
    """The UTF-8 text of the regular file ``path`` (``OSError`` as ``open``,
    ``NotRegularFileError`` for a FIFO and the like; ``BadNameError`` when it is not
    UTF-8)."""
    return decode_text(read_bytes(path), path)


def repeated_column(header: Sequence[str]) -> str | None:
    """The first column a CSV header names twice (blanks aside), else None. A reader that
    keys rows by name keeps the last of the two without a word, and which was meant
    cannot be told: every reader of a header refuses it (naming it in its own words)."""
    names = [h.strip() for h in header]
    return next((n for n in names if n and names.count(n) > 1), None)
