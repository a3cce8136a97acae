"""Horovod's elastic state as the runtime uses it (``trainers/comm.py``): a host
notification that reaches a worker while it resets is not lost.

Horovod's own ``State.on_reset`` empties the notifications. A host added a second after
a host was removed reached the workers during the reset for the removal, was dropped,
and the trainer never grew onto it (seen in shrink-and-grow: a Horovod trainer stayed on
2 of 4 nodes until its work was done). Here Horovod's real ``State``, on one process:
broadcasts are the identity, as on rank 0.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.trainers.elastic_harness import horovod_missing

pytestmark = pytest.mark.skipif(horovod_missing() is not None, reason=str(horovod_missing()))


class _Hvd:
    @staticmethod
    def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
        return obj

    @staticmethod
    def rank() -> int:
        return 0


class _Comm:
    _hvd = _Hvd()


class _Runtime:
    """What the state saves and restores: nothing here."""

    def snapshot(self) -> dict[str, Any]:
        return {}

    def rollback(self, saved: dict[str, Any]) -> None:
        pass

    def sync_key(self) -> int:
        return 0


def test_a_host_added_during_a_reset_makes_the_next_commit_reset_again() -> None:
    from horovod.common.exceptions import HostsUpdatedInterrupt
    from horovod.runner.elastic.worker import HostUpdateResult

    from bftrainer.trainers.comm import horovod_state

    state = horovod_state(_Comm(), _Runtime())  # type: ignore[arg-type]
    state.on_hosts_updated(1.0, HostUpdateResult.removed)
    with pytest.raises(HostsUpdatedInterrupt):
        state.commit()  # the removal: the workers reset
    state.on_hosts_updated(2.0, HostUpdateResult.added)  # arrives while they reset
    state.on_reset()
    assert state.update_pending  # the runtime's step flags ask for a commit
    with pytest.raises(HostsUpdatedInterrupt) as caught:
        state.commit()
    assert caught.value.skip_sync is False  # an addition: the new worker gets the state
    state.on_reset()
    assert not state.update_pending
    state.commit()  # nothing newer: no reset


def test_a_notification_the_reset_already_covered_is_not_acted_on_twice() -> None:
    from horovod.common.exceptions import HostsUpdatedInterrupt
    from horovod.runner.elastic.worker import HostUpdateResult

    from bftrainer.trainers.comm import horovod_state

    state = horovod_state(_Comm(), _Runtime())  # type: ignore[arg-type]
    state.on_hosts_updated(5.0, HostUpdateResult.added)
    with pytest.raises(HostsUpdatedInterrupt):
        state.commit()
    state.on_hosts_updated(4.0, HostUpdateResult.added)  # older than the one acted on
    state.on_reset()
    state.commit()  # kept, but no newer than rank 0's last: ignored
