"""When the runtime re-tunes the batch between resets: apart from checkpoints.

The cost model (docs/trainers.md, "Re-tuning"): a re-tune is rank 0's fit of the
step-time model and its search for the best batch, a few milliseconds to a few tenths
of a second on the host; the move itself rides on the step's flags, so it costs no
collective and no checkpoint. A re-tune is due at each pass over the data (AdaptDL's
cadence) or every ``RETUNE_EVERY_S`` for long epochs, whichever comes first, and only
while re-tunes take at most ``RETUNE_SHARE`` of the time at the last one's cost. A
decision to stay doubles the clock's interval (up to ``MAX_BACKOFF``); a move resets
it, since the new batch's step time is yet to be learnt. Each new pass still brings a
decision (within the share): the noise scale moves with training, and the replay's
figures moved by 1-2% when the passes backed off too (docs/benchmarks.md). With limits
that allow one batch, there is nothing to choose and no re-tune at all.
"""

from __future__ import annotations

import math

from bftrainer.trainers.goodput import BatchLimits

RETUNE_SHARE = 0.005  # the share of the time re-tunes may take, at the last one's cost
RETUNE_EVERY_S = 60.0  # a re-tune at least this often (times the back-off) in long epochs
MAX_BACKOFF = 8  # a run of decisions to stay stretches the clock's interval this much


def one_batch(limits: BatchLimits) -> bool:
    """The limits allow one total batch: the base configuration (the fewest
    micro-steps for it) is then the fastest the step-time model can predict."""
    return limits.max_batch_size == limits.base_batch_size


class RetuneCadence:
    """Rank 0's clock for re-tunes (``due``), fed with each decision (``record``)."""

    def __init__(self, limits: BatchLimits, enabled: bool) -> None:
        self.enabled = enabled and not one_batch(limits)
        self.backoff = 1
        self.cost_s = 0.0  # the last re-tune's, on rank 0's host clock
        self.next_epoch = 1
        self.last_t = -math.inf

    def restart(self, epoch: int, now: float) -> None:
        """At a reset: the configuration was just chosen; the next pass re-tunes."""
        self.backoff = 1
        self.next_epoch = epoch + 1
        self.last_t = now

    def due(self, epoch: int, now: float) -> bool:
        if not self.enabled:
            return False
        since_s = now - self.last_t
        if epoch < self.next_epoch and since_s < RETUNE_EVERY_S * self.backoff:
            return False
        return self.cost_s <= RETUNE_SHARE * since_s

    def record(self, moved: bool, epoch: int, began: float, now: float) -> None:
        """A decision taken from ``began`` to ``now``: to move, or to stay."""
        self.cost_s = now - began
        self.backoff = 1 if moved else min(MAX_BACKOFF, 2 * self.backoff)
        self.next_epoch = epoch + 1
        self.last_t = now
