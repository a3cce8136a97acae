"""The elastic sampler: every epoch covered exactly once across resizes and rollbacks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bftrainer.trainers.sampler import ElasticSampler, SamplerError, split_evenly

# One operation: a step at (local_bsz, replicas, accum), a commit, or a rollback.
step_op = st.tuples(
    st.just("step"),
    st.integers(1, 9),
    st.integers(1, 4),
    st.integers(0, 2),
)
ops = st.lists(
    st.one_of(step_op, st.just(("commit",)), st.just(("rollback",)), st.just(("restart",))),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 60), work=st.integers(1, 200), seed=st.integers(0, 3), script=ops)
def test_any_sequence_of_sizes_and_rollbacks_covers_each_epoch_once(
    n: int, work: int, seed: int, script: list[tuple]
) -> None:
    sampler = ElasticSampler(n, seed=seed)
    committed_state, committed_done = sampler.state_dict(), 0
    committed: list[tuple[int, list[int]]] = []
    pending: list[tuple[int, list[int]]] = []
    done = 0

    def step(local: int, replicas: int, accum: int) -> None:
        nonlocal done
        plan = sampler.plan(local, replicas, accum, limit=work - done)
        ids = [int(i) for r in range(replicas) for mb in sampler.micro_batches(plan, r) for i in mb]
        assert len(ids) == plan.count <= replicas * local * (accum + 1)
        pending.append((plan.epoch, ids))
        sampler.advance(plan)
        done += plan.count

    for op in script:
        if done >= work:
            break
        if op[0] == "step":
            step(*op[1:])
        elif op[0] == "commit":
            committed.extend(pending)
            pending.clear()
            committed_state, committed_done = sampler.state_dict(), done
        else:  # a rollback (in memory) or a restart (a new sampler from the checkpoint)
            if op[0] == "restart":
                sampler = ElasticSampler(n, seed=seed)
            sampler.load_state_dict(committed_state)
            pending.clear()
            done = committed_done
    while done < work:  # finish the work at some size
        step(3, 2, 1)
    committed.extend(pending)

    assert sum(len(ids) for _, ids in committed) == work
    per_epoch: dict[int, list[int]] = {}
    for epoch, ids in committed:
        per_epoch.setdefault(epoch, []).extend(ids)
    full, rest = divmod(work, n)
    assert sorted(per_epoch) == list(range(full + (1 if rest else 0)))
    for epoch, ids in per_epoch.items():
        if epoch < full:
            assert sorted(ids) == list(range(n)), f"epoch {epoch} not covered exactly once"
        else:
            assert len(ids) == rest and len(set(ids)) == rest


def test_full_step_gives_each_rank_local_batch_per_micro_step() -> None:
    sampler = ElasticSampler(1000, seed=1)
    plan = sampler.plan(local_bsz=8, replicas=3, accum_steps=2)
    assert plan.count == 72
    shares = [sampler.micro_batches(plan, r) for r in range(3)]
    assert all(len(mb) == 8 for share in shares for mb in share)
    ids = np.concatenate([mb for share in shares for mb in share])
    assert len(set(ids.tolist())) == 72


def test_last_step_of_an_epoch_is_truncated_not_padded() -> None:
    sampler = ElasticSampler(10, seed=0)
    sampler.advance(sampler.plan(4, 2))
    plan = sampler.plan(4, 2)
    assert plan.count == 2
    sampler.advance(plan)
    assert (sampler.epoch, sampler.position) == (1, 0)


def test_order_is_the_same_in_every_process_and_differs_per_epoch() -> None:
    a, b = ElasticSampler(100, seed=7), ElasticSampler(100, seed=7)
    assert a.order(3).tolist() == b.order(3).tolist()
    assert a.order(0).tolist() != a.order(1).tolist()


def test_state_from_another_data_set_is_refused() -> None:
    state = ElasticSampler(100, seed=1).state_dict()
    with pytest.raises(SamplerError, match="data set or seed changed"):
        ElasticSampler(99, seed=1).load_state_dict(state)


def test_split_evenly() -> None:
    assert split_evenly(7, 3) == [0, 2, 4, 7]
    assert split_evenly(2, 4) == [0, 0, 1, 1, 2]
