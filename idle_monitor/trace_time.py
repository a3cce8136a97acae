"""Times in pool traces: parse, format and bound epoch seconds (UTC).

Times may be ``YYYY-mm-dd HH:MM:SS`` (naive means UTC, as in the Summit log), ISO-8601 with
an offset, or epoch seconds. The writers write ISO-8601 UTC with a ``Z`` suffix and, only
when needed, fractional seconds to the microsecond (``2021-02-10T00:08:52Z``).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

# Plausible epoch seconds: 1970-01-01 up to 2200-01-01 UTC. Anything else is a unit or
# typing mistake (epoch milliseconds are ~1e12) that would otherwise overflow date
# arithmetic or stall a virtual clock, so it is refused where a time is read.
EPOCH_MIN_S = 0.0
EPOCH_MAX_S = 7258118400.0
_MS_PER_S = 1000.0
_MS_HINT_MIN_S = 1e8  # 1973: smaller values / 1000 are no date anyone meant


def check_epoch_s(time_s: float, text: str | None = None, *, a_date: bool = False) -> float:
    """``time_s`` if it is a plausible epoch time, else ``ValueError`` naming it (``text``).
    ``a_date``: the text was a date, so no hint that it looks like milliseconds."""
    shown = repr(text) if text is not None else repr(time_s)
    if not math.isfinite(time_s):
        raise ValueError(f"time {shown} is not finite")
    if EPOCH_MIN_S <= time_s < EPOCH_MAX_S:
        return time_s
    hint = ""
    if not a_date and _MS_HINT_MIN_S <= time_s / _MS_PER_S < EPOCH_MAX_S:
        hint = (
            f"; it looks like epoch milliseconds ({format_time(time_s / _MS_PER_S)} "
            "if divided by 1000): times must be epoch seconds"
        )
    raise ValueError(
        f"time {shown} is outside the plausible range of epoch seconds "
        f"({format_time(EPOCH_MIN_S)} to {format_time(EPOCH_MAX_S)}){hint}"
    )


def parse_time_s(text: str) -> float:
    """Epoch seconds (UTC) from epoch seconds, ``YYYY-mm-dd HH:MM:SS`` or ISO-8601.

    A time without an offset is UTC. The result lies in 1970..2200 (``check_epoch_s``).
    Raises ``ValueError`` naming the text.
    """
    s = text.strip()
    try:
        value = float(s)
    except ValueError:
        pass
    else:
        return check_epoch_s(value, text)
    try:
        moment = datetime.fromisoformat(s)
    except ValueError:
        raise ValueError(
            f"bad time {text!r} (expected YYYY-mm-dd HH:MM:SS, ISO-8601 or epoch seconds)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return check_epoch_s(moment.timestamp(), text, a_date=True)


def format_time(time_s: float) -> str:
    """ISO-8601 UTC with ``Z``; fractional seconds (to the microsecond) only when present.

    A time no date can hold (NaN, years past 9999) is shown as epoch seconds, so an error
    message about a bad time never fails itself.
    """
    try:
        moment = datetime.fromtimestamp(time_s, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return f"{time_s!r} (epoch s)"
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return text + "Z"


def quantize_time_s(time_s: float) -> float:
    """The time a trace file gives back for ``time_s`` once written (microsecond precision)."""
    return parse_time_s(format_time(time_s))
