"""The pool event: the one record every pool source (live scheduler or trace) emits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PoolEvent:
    """A change of the idle-node pool at one instant.

    ``time_s`` is seconds since the Unix epoch (UTC). ``joined`` nodes became usable,
    ``left`` nodes were taken back by the main scheduler, without warning. ``windows_s``
    maps a pool node to the seconds until the main scheduler is known to take it back,
    or ``None`` when open-ended; it may cover only the nodes whose window is known or
    changed, and is empty for sources that do not know windows (most traces).
    """

    time_s: float
    joined: frozenset[str] = frozenset()
    left: frozenset[str] = frozenset()
    windows_s: Mapping[str, float | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        both = self.joined & self.left
        if both:
            raise ValueError(f"nodes both joined and left at t={self.time_s}: {sorted(both)[:5]}")

    @property
    def empty(self) -> bool:
        return not self.joined and not self.left
