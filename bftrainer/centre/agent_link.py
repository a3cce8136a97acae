"""A user's agent in centre mode: today's daemon, run as the user, following the allocator.

``bftrainer agent --socket-dir DIR`` (started by ``bftrainer submit --socket-dir DIR`` when
none runs) is a :class:`~bftrainer.daemon.Daemon` on the user's own state directory, with
the user's rights: it submits and cancels the user's holder jobs (so the scheduler
charges the user), runs the supervisors, and keeps the records, exactly as a single-user
daemon does. Two things differ, both through :class:`AgentLink`:

- the allocator decides. The link is a source of the agent's loop: every
  ``sync_every_s`` it reports the user's unfinished trainers (their nodes, curves,
  progress) and brings back the nodes the allocator gives each; when they changed, the
  loop decides again with :class:`~bftrainer.policies.follow.FollowPolicy`, which hands
  each trainer its assigned nodes whose holder runs;
- the holders follow the assignment (``hold_plan.plan_assigned``), not a demand.

While the allocator is unreachable (killed, restarting) nothing moves: the trainers keep
the nodes they have, and the next sync after it returns registers them again.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bftrainer.centre import protocol
from bftrainer.centre.protocol import SyncReply, SyncRequest, TrainerReport
from bftrainer.centre.transport import SOCKET_NAME, RequestRefused, TransportError, call
from bftrainer.loop import Assignment, LoopView, Polled, TrainerState
from bftrainer.policies.follow import FollowPolicy
from bftrainer.state import Store, UnknownTrainerError

log = logging.getLogger(__name__)

# A sync waits this long for the allocator's reply: the agent's loop waits with it.
SYNC_TIMEOUT_S = 5.0


class AgentLink:
    """The agent's tie to the allocator (see the module docstring); a loop source."""

    def __init__(self, socket_dir: Path, sync_every_s: float = 1.0) -> None:
        self.path = socket_dir / SOCKET_NAME
        self.sync_every_s = sync_every_s
        self.assignment: dict[str, tuple[str, ...]] = {}
        self.policy = FollowPolicy()
        self.store: Store | None = None
        self._next_s = -math.inf
        self._reachable = True
        self.syncs = 0
        self._reply: SyncReply | None = None  # read()'s, for this step's poll

    def attach(self, store: Store) -> None:
        self.store = store

    @staticmethod
    def report(view: LoopView | None) -> SyncRequest:
        """The user's unfinished trainers, and the nodes the holders run on (the loop's
        pool): the allocator refuses to this user what it assigned and never got."""
        if view is None:
            return SyncRequest(())
        trainers = tuple(_report(t) for t in view.trainers)
        return SyncRequest(trainers, tuple(sorted(view.pool)))

    def read(self, now_s: float, view: LoopView | None = None) -> None:
        """Sync with the allocator, when due, reporting ``view`` (the loop's trainers and
        pool): outside the step's transaction (it may wait for the allocator);
        :meth:`poll` applies the reply inside it."""
        self._reply = None
        if now_s < self._next_s:
            return
        request = self.report(view).to_dict()
        try:
            body = call(self.path, protocol.SYNC, request, timeout_s=SYNC_TIMEOUT_S)
            reply = SyncReply.from_dict(body)
        except (TransportError, RequestRefused, ValueError) as exc:
            if self._reachable:
                what = (
                    "refused this agent's report"
                    if isinstance(exc, RequestRefused)
                    else "cannot be reached"
                )
                log.warning(
                    "the allocator %s (%s): the trainers keep their nodes; trying again every %g s",
                    what,
                    exc,
                    self.sync_every_s,
                )
            self._reachable = False
            self._next_s = now_s + self.sync_every_s
            return
        if not self._reachable:
            log.info("the allocator answers again: registered the trainers anew")
        self._reachable = True
        self.syncs += 1
        self.sync_every_s = reply.sync_every_s
        self._next_s = now_s + self.sync_every_s
        self._reply = reply

    def poll(self, now_s: float) -> Polled:
        reply, self._reply = self._reply, None
        if reply is None:
            return Polled((), self._next_s)
        self._cancel(reply.cancel)
        changed = dict(reply.assignment) != self.assignment
        self.assignment = dict(reply.assignment)
        return Polled((Assignment(dict(self.assignment)),) if changed else (), self._next_s)

    def _cancel(self, trainer_ids: tuple[str, ...]) -> None:
        assert self.store is not None
        for tid in trainer_ids:
            try:
                row = self.store.request_cancel(tid)
            except UnknownTrainerError:
                log.warning("the allocator asked to cancel %s, which is not ours: ignored", tid)
                continue
            log.info("trainer %s: cancel requested through the allocator (%s now)", tid, row.state)


def _report(t: TrainerState) -> TrainerReport:
    return TrainerReport.of_job(
        t.job, id=t.id, nodes=t.nodes, samples_done=t.processed_samples, curves=t.reported_curves
    )


def hello(socket_dir: Path) -> Mapping[str, Any]:
    """The centre's settings, from its allocator: what the agent needs to act as the
    centre configured (the scheduler, the holders' partition and options, timings)."""
    return call(socket_dir / SOCKET_NAME, protocol.HELLO, {}, timeout_s=SYNC_TIMEOUT_S)
