"""When re-tunes are due: one rule for the live runtime and the replay's trainers."""

from __future__ import annotations

from bftrainer.trainers.goodput import BatchLimits
from bftrainer.trainers.retune_cadence import (
    MAX_BACKOFF,
    RETUNE_EVERY_S,
    RETUNE_SHARE,
    RetuneCadence,
)

LIMITS = BatchLimits(base_batch_size=64, max_batch_size=1024, max_local_bsz=256)


def test_a_pass_over_the_data_or_the_clock_makes_a_retune_due() -> None:
    c = RetuneCadence(LIMITS, enabled=True)
    c.restart(epoch=0, now=0.0)
    assert not c.due(0, 1.0)  # same pass, a second later
    assert c.due(1, 1.0)  # the next pass
    assert c.due(0, RETUNE_EVERY_S)  # a long pass: the clock


def test_stays_back_off_the_clock_and_a_move_resets_it() -> None:
    c = RetuneCadence(LIMITS, enabled=True)
    c.restart(epoch=0, now=0.0)
    c.record(moved=False, epoch=1, began=10.0, now=10.0)
    assert not c.due(1, 10.0 + 2 * RETUNE_EVERY_S - 1)
    assert c.due(1, 10.0 + 2 * RETUNE_EVERY_S)  # twice the interval
    assert c.due(2, 11.0)  # each new pass all the same
    c.record(moved=False, epoch=2, began=20.0, now=20.0)
    assert not c.due(2, 20.0 + 4 * RETUNE_EVERY_S - 1) and c.due(2, 20.0 + 4 * RETUNE_EVERY_S)
    for _ in range(10):
        c.record(moved=False, epoch=2, began=30.0, now=30.0)
    assert c.backoff == MAX_BACKOFF
    c.record(moved=True, epoch=2, began=40.0, now=40.0)
    assert c.due(2, 40.0 + RETUNE_EVERY_S)  # back to every minute


def test_a_costly_decision_waits_for_its_share_of_the_time() -> None:
    c = RetuneCadence(LIMITS, enabled=True)
    c.restart(epoch=0, now=0.0)
    c.record(moved=True, epoch=0, began=0.0, now=1.0)  # 1 s to decide
    assert not c.due(1, 1.0 + 0.9 / RETUNE_SHARE)
    assert c.due(1, 1.0 + 1.0 / RETUNE_SHARE)


def test_limits_with_one_batch_or_no_retune_never_make_one_due() -> None:
    one = BatchLimits(base_batch_size=64, max_batch_size=64, max_local_bsz=256)
    assert not RetuneCadence(one, enabled=True).due(5, 1e9)
    assert not RetuneCadence(LIMITS, enabled=False).due(5, 1e9)
