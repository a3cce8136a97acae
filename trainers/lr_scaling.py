"""Learning-rate scaling rules for a batch size other than the tuned one, as plug-ins.

A rule maps the total batch M, the base batch M0 (the one the learning rate ``lr0`` was
tuned for) and the current PGNS phi to a factor: the trainer uses ``lr0 * factor``.

* ``linear`` (Goyal et al. 2017): M / M0.
* ``sqrt`` (Krizhevsky 2014; Hoffer et al. 2017): sqrt(M / M0).
* ``adascale`` (Johnson et al. 2020, used by Pollux §3.1): the gain ratio
  r = (phi + M0) M / ((phi + M) M0), between 1 and M / M0; it is the number of base-batch
  steps one step is worth, so it also advances the trainer's statistical progress.

A new rule is a class with ``name`` and ``factor`` added to :data:`RULES`.
"""

from __future__ import annotations

import logging
import math
from typing import Protocol

from bftrainer.trainers.efficiency import step_gain

logger = logging.getLogger(__name__)


class UnknownLRRuleError(KeyError):
    """A learning-rate rule name that is not in :data:`RULES`."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else super().__str__()


class LRScalingRule(Protocol):
    """Maps (M, M0, phi) to the learning-rate factor; phi is None until measured."""

    name: str

    def factor(self, batch_size: int, base_batch_size: int, pgns: float | None) -> float: ...


def _check(batch_size: int, base_batch_size: int) -> None:
    if base_batch_size < 1 or batch_size < 1:
        raise ValueError(f"batch sizes must be >= 1, got M={batch_size}, M0={base_batch_size}")


class LinearScaling:
    """lr = lr0 * M / M0."""

    name = "linear"

    def factor(self, batch_size: int, base_batch_size: int, pgns: float | None) -> float:
        _check(batch_size, base_batch_size)
        return batch_size / base_batch_size


class SqrtScaling:
    """lr = lr0 * sqrt(M / M0)."""

    name = "sqrt"

    def factor(self, batch_size: int, base_batch_size: int, pgns: float | None) -> float:
        _check(batch_size, base_batch_size)
        return math.sqrt(batch_size / base_batch_size)


class AdaScale:
    """lr = lr0 * r, r = (phi + M0) M / ((phi + M) M0) (AdaScale's gain ratio).

    Before any PGNS is measured the gain is unknown; the factor is then 1 (no scaling),
    the safe choice. Below M0, where Pollux does not run, it falls back to linear.
    """

    name = "adascale"

    def factor(self, batch_size: int, base_batch_size: int, pgns: float | None) -> float:
        _check(batch_size, base_batch_size)
        return step_gain(batch_size, base_batch_size, pgns)


RULES: dict[str, LRScalingRule] = {r.name: r for r in (LinearScaling(), SqrtScaling(), AdaScale())}


def lr_rule(name: str) -> LRScalingRule:
    """The rule registered under ``name``."""
    try:
        return RULES[name]
    except KeyError:
        raise UnknownLRRuleError(
            f"unknown learning-rate rule {name!r}; choose from {', '.join(sorted(RULES))}"
        ) from None
