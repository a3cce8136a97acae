"""The daemon's tie to a centre allocator, as the service sees it.

A protocol only: :mod:`bftrainer.centre.agent` implements it, and the service takes one
without importing the centre (a daemon on its own never loads it).
"""

from __future__ import annotations

from typing import Protocol

from bftrainer.loop import Loop, Policy, Polled
from bftrainer.state import Store


class CentreLink(Protocol):
    """A centre agent's tie to the allocator (bftrainer.centre.agent): a source of the
    agent's loop that reports its trainers and brings back the allocator's assignment,
    the policy that follows it, and the nodes the holders should keep."""

    @property
    def policy(self) -> Policy: ...

    def read(self, now_s: float) -> None: ...

    def poll(self, now_s: float) -> Polled: ...

    def assigned_nodes(self) -> set[str]: ...

    def attach(self, loop: Loop, store: Store) -> None: ...
