"""The one numeric option type of every command: finite, and bounded where it must be.

click's ``FLOAT``/``INT`` and even ``FloatRange`` accept ``nan`` (every comparison with
it is false) and ``inf``; a solver limit of NaN or a duration of infinity then fails far
from the option, or never ends. Every numeric option uses :class:`Number` instead, so
the check lives here once; ``tests/test_cli_hardening.py`` walks every command to keep
it so.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any

import click

from bftrainer.common.names import MAX_NODES, MAX_SLOTS, not_regular


class Number(click.ParamType):
    """A finite ``float`` (or ``int`` with ``integer=True``) within optional bounds.

    ``min_open``/``max_open`` exclude the bound itself. NaN and infinities are always
    refused, naming the option and the value.
    """

    def __init__(
        self,
        *,
        integer: bool = False,
        min: float | None = None,
        max: float | None = None,
        min_open: bool = False,
        max_open: bool = False,
    ) -> None:
        self.integer = integer
        self.min, self.max = min, max
        self.min_open, self.max_open = min_open, max_open
        self.name = "integer" if integer else "float"

    def describe(self) -> str:
        """The accepted values in words, e.g. ``a finite number >= 0``."""
        what = "an integer" if self.integer else "a finite number"
        parts = []
        if self.min is not None:
            parts.append(f"{'>' if self.min_open else '>='} {self.min:g}")
        if self.max is not None:
            parts.append(f"{'<' if self.max_open else '<='} {self.max:g}")
        return f"{what} {' and '.join(parts)}".rstrip()

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = self.parse(value)
        if number is None:
            self.fail(f"{value!r} is not {self.describe()}", param, ctx)
        return number

    def parse(self, value: Any) -> int | float | None:
        """The value as a number if it is acceptable, else None (for callers that
        parse lists, like ``--sweep``)."""
        if isinstance(value, bool):
            return None
        number: int | float
        if isinstance(value, int | float):
            number = value
        else:
            text = str(value).strip()
            try:
                number = int(text) if self.integer else float(text)
            except ValueError:
                return None
        if not math.isfinite(number):
            return None
        if self.integer:
            if isinstance(number, float) and not number.is_integer():
                return None
            number = int(number)
        if self.min is not None and (number < self.min or (self.min_open and number == self.min)):
            return None
        if self.max is not None and (number > self.max or (self.max_open and number == self.max)):
            return None
        return number

    def __repr__(self) -> str:
        return f"Number({self.describe()})"


# Shared bounds, so the same quantity has the same limits in every command.
SECONDS = Number(min=0.0)
POSITIVE = Number(min=0.0, min_open=True)
COUNT = Number(integer=True, min=1)
NODES = Number(integer=True, min=1, max=MAX_NODES)  # node, host and slot counts of a trainer
SAMPLES = Number(integer=True, min=1, max=2**53)  # exact as a float; fits SQLite's INTEGER
SEED = Number(integer=True, min=0)
# A synthetic trace is generated event by event: a year at most, so a typo cannot run
# for ever.
SYNTHETIC_HOURS = Number(min=0.0, min_open=True, max=366 * 24.0)


# Nodes of a synthetic trace: a machine far beyond any real one still fits in memory.
SYNTHETIC_NODES = Number(integer=True, min=1, max=1_000_000)


def not_regular_file(path: Path) -> str | None:
    """Why ``path`` cannot be read as an input file, or None. A FIFO (or a device, a
    socket) blocks the reader forever or never ends, so only regular files are read;
    ``stat`` answers without opening it. A missing path is left to the reader's own
    message."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else not_regular(path, mode)


def file_to_read_error(path: Path) -> str | None:
    """Why ``path`` is no file to read, naming it (missing, a folder, a FIFO...), or None:
    for paths a command checks itself (a trainer script before its own arguments)."""
    if not path.exists():
        return f"{path}: no such file"
    return not_regular_file(path)


class InputFile(click.Path):
    """A file a command reads: a regular file (or '-' for stdin where allowed)."""

    def __init__(
        self, *, exists: bool = False, allow_dash: bool = False, path_type: type | None = Path
    ) -> None:
        super().__init__(exists=exists, dir_okay=False, allow_dash=allow_dash, path_type=path_type)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = super().convert(value, param, ctx)
        if str(path) != "-":
            problem = not_regular_file(Path(os.fsdecode(path)))
            if problem is not None:
                self.fail(problem, param, ctx)
        return path


class InputTextFile(click.File):
    """``click.File("r")`` that refuses a FIFO, device or socket before opening it."""

    def __init__(self) -> None:
        super().__init__("r")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str | Path) and str(value) != "-":
            problem = not_regular_file(Path(value))
            if problem is not None:
                self.fail(problem, param, ctx)
        return super().convert(value, param, ctx)


class SlotsPerNode(click.ParamType):
    """``--slots-per-node``: a whole number of slots, 1 to 1024, or ``gres`` (read from
    the scheduler's GPU counts; the daemon only)."""

    name = "S|gres"
    _number = Number(integer=True, min=1, max=MAX_SLOTS)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.strip().lower() == "gres":
            return "gres"
        number = self._number.parse(value)
        if number is None:
            self.fail(f"{value!r} is not {self._number.describe()}, nor gres", param, ctx)
        return number
