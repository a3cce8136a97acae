"""The daemon's settings as ``status`` reads them, each checked for its shape on read.

The daemon writes them (``pool``, ``slots_per_node``, ``slots_from``); another program,
an older bftrainer or a hand edit may leave something else. A setting of another shape
is a ``StateError`` naming the setting and the field, so that ``status`` says it in one
line (as it does for a damaged file) instead of a traceback when it prints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bftrainer.state.errors import StateError

GRES = "gres"
SLOTS_FROM = ("config", GRES)
HOLDER_STATES_SEEN = (None, "pending", "running")


class SettingShapeError(StateError):
    """A daemon setting in the store is not of the shape this version writes."""


MISSING = object()


def _bad(path: Path, key: str, what: str, value: object) -> SettingShapeError:
    shown = "missing" if value is MISSING else repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return SettingShapeError(
        f"{path}: setting {key!r}: {what} is {shown}, not as bftrainer writes it "
        "(the store is damaged or of another program)"
    )


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _text_or_none(value: object) -> bool:
    return value is None or isinstance(value, str)


def check_slots_per_node(path: Path, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(path, "slots_per_node", "the value", value)
    return value


def check_slots_from(path: Path, value: object) -> str:
    if value not in SLOTS_FROM:
        raise _bad(path, "slots_from", "the value", value)
    return str(value)


def check_pool(path: Path, value: object) -> dict[str, Any]:
    """The ``pool`` setting: ``{"time_s", "nodes": {node: {...}}, "holders_failing"}``."""
    key = "pool"
    if not isinstance(value, Mapping):
        raise _bad(path, key, "the value", value)
    time_s = value.get("time_s")
    if time_s is not None and not _number(time_s):
        raise _bad(path, key, "time_s", time_s)
    nodes = value.get("nodes", {})
    if not isinstance(nodes, Mapping):
        raise _bad(path, key, "nodes", nodes)
    for name, info in nodes.items():
        _check_node(path, key, name, info)
    failing = value.get("holders_failing")
    if failing is not None:
        _check_failing(path, key, failing)
    return dict(value)


def _check_node(path: Path, key: str, name: object, info: object) -> None:
    where = f"node {name!r}"
    if not isinstance(info, Mapping):
        raise _bad(path, key, where, info)
    window = info.get("window_s")
    if window is not None and not (_number(window) and window >= 0):
        raise _bad(path, key, f"{where}'s window_s", window)
    if info.get("holder_state") not in HOLDER_STATES_SEEN:
        raise _bad(path, key, f"{where}'s holder_state", info.get("holder_state"))
    for field in ("holder", "trainer", "left_out"):
        if not _text_or_none(info.get(field)):
            raise _bad(path, key, f"{where}'s {field}", info.get(field))
    slots = info.get("slots", {})
    if not isinstance(slots, Mapping) or not all(
        isinstance(t, str)
        and isinstance(s, list)
        and all(isinstance(i, int) and not isinstance(i, bool) for i in s)
        for t, s in slots.items()
    ):
        raise _bad(path, key, f"{where}'s slots", slots)


def _check_failing(path: Path, key: str, failing: object) -> None:
    where = "holders_failing"
    if not isinstance(failing, Mapping):
        raise _bad(path, key, where, failing)
    for field in ("cause", "job_id"):
        if not isinstance(failing.get(field), str):
            raise _bad(path, key, f"{where}'s {field}", failing.get(field, MISSING))
    nodes = failing.get("nodes")
    if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
        raise _bad(path, key, f"{where}'s nodes", failing.get("nodes", MISSING))
    next_try_s = failing.get("next_try_s")
    if not _number(next_try_s):
        raise _bad(path, key, f"{where}'s next_try_s", failing.get("next_try_s", MISSING))
