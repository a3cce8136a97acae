"""What the scheduler says of the daemon's holders, recorded: each holder's state in the
store, a failure named with its cause and its node backed off, an end said in an
operator's words, and orders to end the holders that are not ours (strays, requeued).

:class:`~bftrainer.daemon.held_pool.HeldPool` reads before the step's transaction
(:meth:`HolderRecords.read`: one status call) and records inside it
(:meth:`HolderRecords.record`); the orders it returns go into the step's hold orders,
carried out after the commit through the one cancel path. Nothing here acts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from bftrainer.daemon.hold_orders import EndHolders, HoldOrder
from bftrainer.holders.base import Holders, HolderStatus, HolderStatusError
from bftrainer.holders.failures import HolderBackoff, failed_to_hold
from bftrainer.service.reading import HoldCounts
from bftrainer.state import HolderRow, Store, TransitionError

log = logging.getLogger("bftrainer.daemon.held_pool")  # the daemon log's name, as before

# How long a scheduler lists a job it took, at least, ended or not (Slurm's MinJobAge).
LISTED_FOR_S = 300.0


@dataclass(frozen=True)
class HoldersRead:
    """One read of our holders (:meth:`HolderRecords.read`): the scheduler's answer on those
    we know, and the cause of each that failed to hold."""

    live: Mapping[str, HolderStatus]
    gone: Mapping[str, HolderStatus]
    causes: Mapping[str, str]
    # Holders to end: unknown to the store (a daemon died between submitting and
    # recording them) or lingering (suspended by a preemption); ended by this step's
    # orders, through the one cancel path (HeldPool.cancel), never by the read.
    strays: Mapping[str, HolderStatus] = field(default_factory=dict)


class HolderRecords:
    """Records what the scheduler says of our holders (see the module docstring). Shares
    the pool's counts, back-off and leases, which it updates in place."""

    def __init__(
        self,
        holders: Holders,
        store: Store,
        counts: HoldCounts,
        backoff: HolderBackoff,
        lease_until: Mapping[str, float],
    ) -> None:
        self.holders = holders
        self.store = store
        self.counts = counts
        self.backoff = backoff
        self.lease_until = lease_until  # node -> when its lease ends (the pool renews it)

    def read(self, submitted: Mapping[str, str]) -> HoldersRead:
        """Our holders as the scheduler lists them (the strays named, to be ended by
        the step's orders), and why each that failed to hold failed."""
        rows = {h.job_id: h for h in self.store.holders(live_only=True)}
        # The holders the last step submitted are ours too, recorded at the coming poll.
        known = {**{j: h.node for j, h in rows.items()}, **submitted}
        result = self.holders.survey(known)
        if (
            known
            and not (result.live or result.cancelled)
            and all(s.reason == "not listed" for s in result.gone.values())
        ):
            _refuse_an_empty_listing(self.holders.status_argv()[0], rows, submitted, time.time())
        causes = {
            job_id: self.holders.why_failed(job_id, status)
            for job_id, status in result.gone.items()
            if job_id in known
            and failed_to_hold(rows[job_id].state if job_id in rows else "pending", status.reason)
        }
        return HoldersRead(result.live, result.gone, causes, result.cancelled)

    def record(self, read: HoldersRead, now_s: float) -> list[HoldOrder]:
        """Record the holders' states as read (those live in the store now: one our own
        cancel ended since is recorded already, one submitted since the read is not);
        the orders to end the strays and the requeued (run after the step's commit)."""
        orders: list[HoldOrder] = []
        current = {h.job_id: h for h in self.store.holders(live_only=True)}
        if read.strays:
            strays = tuple(sorted(read.strays.items()))
            ids = tuple(j for j, _ in strays)
            orders.append(EndHolders(ids, "not ours", "stray", strays=strays))
        for job_id, status in read.live.items():
            was = current.get(job_id)
            if was is None:
                continue
            try:
                self.store.set_holder_state(job_id, status.state, reason=status.reason, now_s=now_s)
            except TransitionError:
                # Running in the store, pending in the scheduler: requeued (holders are
                # --no-requeue, so only a site's override does this). Not ours any more.
                log.warning(
                    "%s's holder %s was requeued by the scheduler: releasing it",
                    status.node,
                    job_id,
                )
                orders.append(EndHolders((job_id,), "requeued", "requeued", now_s))
                continue
            if status.state == "running":
                self.backoff.held(status.node)
            if status.state == "running" and was.state == "pending":
                limit = "none" if was.limit_s is None else f"up to {was.limit_s / 60:.0f} min"
                log.info("holding %s (holder %s, time limit: %s)", status.node, job_id, limit)
        for job_id, status in read.gone.items():
            was = current.get(job_id)
            if was is None:
                continue
            if job_id in read.causes:
                self._failed(was, status, read.causes[job_id], now_s)
            else:
                self.holders.forget(job_id)
                why = self.why_ended(was, status.reason, now_s)
                self.store.set_holder_state(job_id, "ended", reason=why, now_s=now_s)
                if status.reason == "preempted":
                    self.counts.preempted += 1
                else:
                    self.counts.lost += 1
                log.info("lost %s: its holder %s %s", status.node, job_id, why)
        return orders

    def _failed(self, holder: HolderRow, status: HolderStatus, cause: str, now_s: float) -> None:
        """A holder that failed to hold: its cause in one line, its node backed off."""
        self.store.set_holder_state(holder.job_id, "ended", reason=f"failed: {cause}", now_s=now_s)
        self.counts.failed += 1
        entry = self.backoff.failed(holder.node, holder.job_id, cause, now_s)
        log.warning(
            "holder %s for %s failed: %s; %s is tried again in %.3g s (failure %d in a row)",
            holder.job_id,
            holder.node,
            cause,
            holder.node,
            entry.retry_s - now_s,
            entry.failures,
        )
        stderr = self.holders.stderr_file(holder.job_id)
        if stderr is not None and status.reason == "failed" and not stderr.exists():
            # Slurm fails a job whose --error folder the node cannot see: the state
            # directory is not shared with the nodes. Holders go on without the file.
            log.warning(
                "holder stderr is not written to %s (a folder the nodes do not see?): "
                "holders keep no stderr from now on",
                stderr.parent,
            )
            self.holders.stderr_dir = None

    def why_ended(self, holder: HolderRow, reason: str, now_s: float) -> str:
        """Why a holder ended, in an operator's words (the scheduler's state as given)."""
        if reason == "preempted":
            return "was preempted by a main job"
        if reason in ("cancelled", "canceled"):
            return "was cancelled outside bftrainer"
        if reason == "timeout":
            return "reached its time limit"
        if reason == "not listed":
            return f"is no longer listed by {self.holders.status_argv()[0]}"
        lease = self.lease_until.get(holder.node)
        if reason == "completed" and lease is not None and lease <= now_s:
            return "ended by itself: its lease expired"
        if reason == "completed" and holder.state == "running":
            return "ended by itself"
        return f"ended ({reason or 'no reason given'})"


def _refuse_an_empty_listing(
    command: str, rows: Mapping[str, HolderRow], submitted: Mapping[str, str], now_s: float
) -> None:
    """A listing with none of our holders, when one of them was submitted too recently
    to be gone from it, is no answer: a scheduler lists a job it took, ended or not, for
    ``LISTED_FOR_S`` at least (Slurm's MinJobAge, 300 s by default; LSF's CLEAN_PERIOD,
    3,600 s). Taken as an answer, an empty reply (exit 0, nothing printed) ended every
    holder: a running trainer lost its nodes, and a holder was submitted again at every
    poll. The last known holders stand instead (``HolderStatusError``). After a long
    outage every holder is older than that, and an empty listing is believed."""
    recent = sorted(
        [j for j in submitted] + [j for j, h in rows.items() if now_s - h.submit_s < LISTED_FOR_S]
    )
    if recent:
        raise HolderStatusError(
            f"{command} listed none of our {len(rows) + len(submitted)} holder(s), though "
            f"{', '.join(recent[:5])} {'was' if len(recent) == 1 else 'were'} submitted less "
            f"than {LISTED_FOR_S:.0f} s ago: an empty reply, taken as no answer"
        )
