"""The daemon's tie to a centre allocator, as the service sees it.

A protocol only: :mod:`bftrainer.centre.agent_link` implements it, and the service takes one
without importing the centre (a daemon on its own never loads it).
"""

from __future__ import annotations

from typing import Protocol

from bftrainer.loop import LoopView, Policy, Polled
from bftrainer.state import Store


class CentreLink(Protocol):
    """A centre agent's tie to the allocator (bftrainer.centre.agent_link): a source of the
    agent's loop that reports its trainers (the loop hands them to ``read``) and brings
    back the allocator's assignment, and the policy that follows it (its decisions say
    which nodes the holders keep: ``Decision.hold``)."""

    @property
    def policy(self) -> Policy: ...

    def read(self, now_s: float, view: LoopView | None = None) -> None: ...

    def poll(self, now_s: float) -> Polled: ...

    def attach(self, store: Store) -> None: ...
