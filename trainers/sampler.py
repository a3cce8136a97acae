"""An elastic distributed sampler: exact epochs across resets, restarts and rollbacks.

The sampler's whole state is two integers, ``epoch`` and ``position`` (samples of the
epoch consumed so far), so it can be committed with the model and broadcast in a few
bytes. The order of an epoch is a permutation drawn from ``seed + epoch``, the same on
every rank and in every process. A step takes the next global batch from ``position``
(``replicas x local_bsz x (accum_steps + 1)`` samples, fewer at the end of an epoch or of
the work), gives each rank a contiguous share and splits that share into the step's
micro-batches. Since nothing but ``position`` moves, any number of replicas and any
batch size may follow any other, and rolling back to a committed ``(epoch, position)``
replays exactly the uncommitted samples: within an epoch no sample is skipped or seen
twice.

Unlike Horovod's ``ElasticSampler`` (which pads the last batch by repeating samples, and
records progress as ``batch_size x num_replicas`` of the *new* size), the last step is
truncated and progress counts the samples actually planned.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

logger = logging.getLogger(__name__)


class SamplerError(ValueError):
    """A sampler argument or state that cannot be used (names the value)."""


def split_evenly(total: int, parts: int) -> list[int]:
    """Boundaries of ``parts`` contiguous shares of ``total`` items, sizes differing by <= 1."""
    return [total * i // parts for i in range(parts + 1)]


@dataclass(slots=True)
class StepPlan:
    """The samples of one optimizer step: ``count`` from ``start`` of ``epoch``'s order.

    Not frozen: one is made every step, and a frozen dataclass costs a microsecond to
    build (0.15% of the example's 0.66 ms step) against a third of that. Treat it as a
    value all the same.
    """

    epoch: int
    start: int
    count: int
    replicas: int
    accum_steps: int


class ElasticSampler:
    """Deterministic per-epoch order over ``num_samples`` items, with a global position."""

    def __init__(self, num_samples: int, seed: int = 0, shuffle: bool = True) -> None:
        if not isinstance(num_samples, int) or num_samples < 1:
            raise SamplerError(f"num_samples must be an integer >= 1, got {num_samples!r}")
        self.num_samples = num_samples
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order_epoch = -1
        self._order: NDArray[np.int64] = np.arange(0, dtype=np.int64)

    def order(self, epoch: int) -> NDArray[np.int64]:
        """The sample ids of ``epoch`` in the order they are consumed (cached per epoch)."""
        if epoch != self._order_epoch:
            if self.shuffle:
                rng = np.random.default_rng([self.seed, epoch])
                self._order = rng.permutation(self.num_samples).astype(np.int64)
            else:
                self._order = np.arange(self.num_samples, dtype=np.int64)
            self._order_epoch = epoch
        return self._order

    def plan(
        self, local_bsz: int, replicas: int, accum_steps: int = 0, limit: int | None = None
    ) -> StepPlan:
        """The next step's samples (does not move the position; :meth:`advance` does).

        ``limit`` caps the step (the work left); the step never crosses an epoch's end.
        """
        if local_bsz < 1 or replicas < 1 or accum_steps < 0:
            raise SamplerError(
                f"need local_bsz >= 1, replicas >= 1, accum_steps >= 0; got "
                f"{local_bsz}, {replicas}, {accum_steps}"
            )
        count = min(replicas * local_bsz * (accum_steps + 1), self.num_samples - self.position)
        if limit is not None:
            if limit < 1:
                raise SamplerError(f"limit must be >= 1 (work left), got {limit}")
            count = min(count, limit)
        return StepPlan(self.epoch, self.position, count, replicas, accum_steps)

    def micro_batches(self, plan: StepPlan, rank: int) -> list[NDArray[np.int64]]:
        """The ids ``rank`` processes in ``plan``, one array per micro-step (some may be
        empty when the step is truncated)."""
        order = self.order(plan.epoch)
        return [order[a:b] for a, b in self.micro_bounds(plan, rank)]

    @staticmethod
    def micro_bounds(plan: StepPlan, rank: int) -> list[tuple[int, int]]:
        """Where :meth:`micro_batches` lie in the epoch's order, as ``[a, b)`` ranges: the
        same slices of a copy of the order on the device need no ids from the host."""
        if not 0 <= rank < plan.replicas:
            raise SamplerError(f"rank {rank} is not in 0..{plan.replicas - 1}")
        start = plan.start
        if plan.replicas == 1 and plan.accum_steps == 0:
            return [(start, start + plan.count)]  # the common single-process step
        b = split_evenly(plan.count, plan.replicas)
        first, mine = start + b[rank], b[rank + 1] - b[rank]
        m = split_evenly(mine, plan.accum_steps + 1)
        return [(first + m[i], first + m[i + 1]) for i in range(plan.accum_steps + 1)]

    def advance(self, plan: StepPlan) -> None:
        """Mark ``plan``'s samples consumed; the epoch ends when its last sample is."""
        if (plan.epoch, plan.start) != (self.epoch, self.position):
            raise SamplerError(
                f"plan at epoch {plan.epoch} position {plan.start} does not follow the "
                f"sampler's epoch {self.epoch} position {self.position}"
            )
        self.position += plan.count
        if self.position >= self.num_samples:
            self.epoch += 1
            self.position = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "num_samples": self.num_samples,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "epoch": self.epoch,
            "position": self.position,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`; the data set and seed must be the same."""
        mine = (self.num_samples, self.seed, self.shuffle)
        theirs = (state.get("num_samples"), state.get("seed"), state.get("shuffle"))
        if mine != theirs:
            raise SamplerError(
                f"sampler state for (num_samples, seed, shuffle)={theirs} given to one "
                f"with {mine}: the data set or seed changed"
            )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < self.num_samples:
            raise SamplerError(f"bad sampler state: epoch {epoch}, position {position}")
        self.epoch, self.position = epoch, position
