"""Where a file stops being text: the line of its first byte that is not UTF-8.

A text stream decodes a whole chunk (8 KiB) at once, so its ``UnicodeDecodeError`` comes
before the chunk's first line is handed out: a count of lines read names a line thousands
early, and the error itself names only a byte offset in the chunk. Job logs and pool
traces call this on that error's path only, to name ``file:line`` as for any other fault.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path


def line_not_text(path: Path, gz: bool) -> int | None:
    """The number of the first line of ``path`` (gzip-compressed if ``gz``) that is not
    UTF-8, counted as a text stream with ``newline=""`` counts lines (``\\n``, ``\\r\\n``
    or a lone ``\\r`` ends one); None if it cannot tell (the file cannot be read)."""
    number = 0
    try:
        with gzip.open(path, "rb") if gz else path.open("rb") as raw:
            for line in raw:
                line = line.removesuffix(b"\n").removesuffix(b"\r")
                for part in line.split(b"\r"):  # a lone CR ends a line too
                    number += 1
                    try:
                        part.decode("utf-8")
                    except UnicodeDecodeError:
                        return number
    except (OSError, EOFError, zlib.error):
        return None
    return None
