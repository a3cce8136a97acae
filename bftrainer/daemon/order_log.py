"""A step's orders as one kept record: the order log (issue 43).

The daemon keeps each step's :class:`~bftrainer.loop.Orders` in the store's ``orders``
table, inside the step's transaction, and marks them done at the next step, once its
actuator carried them out (``bftrainer/daemon/actuator.py``). A daemon killed between a
commit and the end of its actions leaves them not done: the next start reads them
(:func:`readable`) and does what they ask that the restore does not do from the
trainers' record (``StepActuator.redo``).

A record is the orders as typed JSON: each order a ``{"@": kind, field: value}`` object
of a known kind (nothing else is built from a record), tuples as lists, maps, sets,
paths and non-finite floats tagged. Kept: the trainers' node changes and decided sets,
the hold plan and the driver's orders. Not kept: the exec plan, which is the holders'
record, read again at every step; an ``Acquire``'s pool view beyond its own nodes
(all that submitting their holders reads). The last :data:`KEPT_STEPS` records stay,
for a person reading the store; older ones are dropped.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import fields, is_dataclass, replace
from pathlib import Path, PurePath
from typing import Any

from bftrainer.daemon.hold_orders import Acquire, EndHolders
from bftrainer.daemon.live_orders import EndLeftovers, StartAgain, Stop
from bftrainer.holders.base import HolderStatus
from bftrainer.idle_monitor.source import PoolView
from bftrainer.loop import NodeChange, Orders
from bftrainer.state import OrdersRow
from bftrainer.trainers.launch.base import Launcher

log = logging.getLogger(__name__)

KEPT_STEPS = 1000
# The kinds a record may name: nothing else is built from one.
_KINDS: dict[str, type] = {
    c.__name__: c
    for c in (
        Orders,
        NodeChange,
        EndHolders,
        Acquire,
        PoolView,
        HolderStatus,
        EndLeftovers,
        StartAgain,
        Stop,
    )
}


class OrderRecordError(ValueError):
    """A kept record that does not read back as a step's orders."""


def worth_keeping(orders: Orders) -> bool:
    """Whether the orders ask anything of the actuator beyond the exec plan."""
    return bool(orders.changes or orders.decided or orders.hold or orders.driver)


def encode(orders: Orders) -> str:
    """The record of ``orders`` (see the module docstring)."""
    data = _encode(replace(orders, exec_plan=None))
    return json.dumps(data, separators=(",", ":"), allow_nan=False)


def decode(record: str) -> Orders:
    """The orders a record keeps; ``OrderRecordError`` naming what does not read."""
    try:
        orders = _decode(json.loads(record))
    except json.JSONDecodeError as exc:
        raise OrderRecordError(f"not JSON ({exc.msg} at character {exc.pos})") from None
    except OrderRecordError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise OrderRecordError(f"an order that does not read ({exc})") from None
    if not isinstance(orders, Orders):
        raise OrderRecordError(f"a {type(orders).__name__}, not a step's orders")
    return orders


def readable(rows: Sequence[OrdersRow], where: object) -> list[Orders]:
    """The orders that ``rows`` keep, oldest first; a record that does not read is named
    in one line each and left out (its trainers' part the restore does anyway)."""
    out: list[Orders] = []
    for row in rows:
        try:
            out.append(decode(row.record))
        except OrderRecordError as exc:
            log.error("%s: the orders of step %d do not read, skipped: %s", where, row.step, exc)
    return out


def _encode(value: object) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"@float": repr(value)}
    if isinstance(value, Launcher):  # a supervisor seen from its driver: where, which pid
        return {"@launcher": [str(value.trainer_dir), value.pid]}
    if isinstance(value, Acquire):
        value = replace(value, view=_narrowed(value.view, value.nodes))
    if is_dataclass(value) and not isinstance(value, type) and type(value).__name__ in _KINDS:
        kept = {f.name: _encode(getattr(value, f.name)) for f in fields(value)}
        return {"@": type(value).__name__, **kept}
    if isinstance(value, PurePath):
        return {"@path": str(value)}
    if isinstance(value, frozenset | set):
        return {"@set": sorted(_encode(v) for v in value)}
    if isinstance(value, Mapping):
        return {"@map": {_key(k): _encode(v) for k, v in value.items()}}
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    raise TypeError(f"an order holds a {type(value).__name__}, which the order log cannot keep")


def _key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"an order's map has a {type(key).__name__} key")
    return key


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    if not isinstance(value, dict):
        return value
    if "@float" in value:
        return float(value["@float"])
    if "@path" in value:
        return Path(value["@path"])
    if "@set" in value:
        return frozenset(_decode(v) for v in value["@set"])
    if "@map" in value:
        return {k: _decode(v) for k, v in value["@map"].items()}
    if "@launcher" in value:
        trainer_dir, pid = value["@launcher"]
        return Launcher(Path(trainer_dir), int(pid))
    kind = value.get("@")
    args = {k: _decode(v) for k, v in value.items() if k != "@"}
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise OrderRecordError(f"an order of unknown kind {kind!r}")
    try:
        return cls(**args)
    except TypeError as exc:
        raise OrderRecordError(f"a {kind} order that does not read ({exc})") from None


def _narrowed(view: PoolView, nodes: tuple[str, ...]) -> PoolView:
    """``view`` on ``nodes`` only: what submitting their holders reads of it."""
    keep = set(nodes)
    return replace(
        view,
        pool=view.pool & keep,
        windows_s={n: w for n, w in view.windows_s.items() if n in keep},
        claims_s={n: c for n, c in view.claims_s.items() if n in keep},
        gpus={n: g for n, g in view.gpus.items() if n in keep},
        gpu_errors={n: e for n, e in view.gpu_errors.items() if n in keep},
    )
