"""The curves a simulated Pollux trainer reports to the allocator: goodput and throughput
over its node counts (or, with slots, its replica counts packed and spread), as its
agent's goodput model predicts them, flat past Pollux's exploration cap; and the best
configuration at a count. Pure functions of the model and the trainer's record, apart
from the driver (``pollux_sim.py``) that decides when to report them."""

from __future__ import annotations

import numpy as np

from bftrainer.loop import Curve, TrainerState
from bftrainer.replay.pollux.app import PolluxSimError
from bftrainer.replay.pollux.trainer import PolluxSimOptions, SimTrainer
from bftrainer.trainers.goodput import GoodputConfig, GoodputModel
from bftrainer.trainers.learned_curve import EXPLORATION_GROWTH
from bftrainer.trainers.throughput import predict_step_time


def node_curves(
    t: TrainerState, tr: SimTrainer, gm: GoodputModel, options: PolluxSimOptions
) -> tuple[
    tuple[tuple[float, float], ...],
    tuple[tuple[float, float], ...],
    list[GoodputConfig | None],
]:
    """(goodput, throughput) breakpoints over 1..n_max of what the trainer would run,
    flat past the model's exploration cap, as the allocator takes them; and, adapting,
    the best configuration at each node count up to the cap (one search for all)."""
    n_max = t.job.n_max
    limit = gm.node_limit(1, n_max)
    nodes = list(range(1, limit + 1))
    configs: list[GoodputConfig | None] = []
    if options.batch_adapt:
        configs = gm.best_configs(nodes)
        good = [0.0 if c is None else c.goodput_sps for c in configs]
        goodput = [(float(n), float(v)) for n, v in zip(nodes, good, strict=True)]
        if limit < n_max:
            goodput.append((float(n_max), goodput[-1][1]))
        thr = [0.0 if c is None else c.throughput_sps for c in configs]
    else:
        cfgs = [tr.app.config(n, tr.spec.local_bsz) for n in nodes]
        n_arr = np.array([c.nodes for c in cfgs])
        k_arr = np.array([c.replicas for c in cfgs])
        m_arr = np.array([c.local_bsz for c in cfgs])
        s_arr = np.array([c.accum_steps for c in cfgs])
        batch = np.array([c.batch_size for c in cfgs], dtype=float)
        step_s = predict_step_time(gm.params, n_arr, k_arr, m_arr, s_arr)
        thr = [float(v) for v in batch / step_s]
        good = gm.goodput(n_arr, m_arr, s_arr)
        goodput = [(float(n), float(v)) for n, v in zip(nodes, good, strict=True)]
        if limit < n_max:
            goodput.append((float(n_max), goodput[-1][1]))
    throughput = [(float(n), float(v)) for n, v in zip(nodes, thr, strict=True)]
    if limit < n_max:
        throughput.append((float(n_max), throughput[-1][1]))
    return tuple(goodput), tuple(throughput), configs


def slot_limit(t: TrainerState, tr: SimTrainer, gm: GoodputModel) -> int:
    """Slots: Pollux's exploration cap on replicas (the model's own counts nodes)."""
    seen = max((c.replicas for c in tr.configs), default=1)
    return max(1, min(t.job.n_max, gm.max_feasible_nodes(), EXPLORATION_GROWTH * seen))


def slot_curves(
    t: TrainerState, tr: SimTrainer, gm: GoodputModel, options: PolluxSimOptions
) -> tuple[Curve, Curve, Curve, Curve]:
    """(goodput, throughput) packed, then spread, over 1..n_max slots, flat past the
    exploration cap. Packed: on ceil(k/S) nodes; spread: over 2 nodes. Pollux's model
    tells one node from several only (``predict_step_time``), so the two differ at
    2..S slots alone, and past S the curve is linear between multiples of S (breakpoints
    at 1..S, every multiple of S and the cap: a few dozen, not n_max)."""
    s, n_max = options.slots_per_node, t.job.n_max
    limit = slot_limit(t, tr, gm)
    ks = np.array(sorted({*range(1, min(s, limit) + 1), *range(s, limit + 1, s), limit}))
    split = ks[(ks >= 2) & (ks <= s)]
    all_k = np.concatenate([ks, split])
    all_m = np.concatenate([-(-ks // s), np.full(len(split), 2)])
    if options.batch_adapt:
        configs = gm.best_configs(list(all_m), replicas=list(all_k))
        good = np.array([0.0 if c is None else c.goodput_sps for c in configs])
        thr = np.array([0.0 if c is None else c.throughput_sps for c in configs])
    else:
        cfgs = [
            tr.app.config(int(m), tr.spec.local_bsz, replicas=int(k))
            for m, k in zip(all_m, all_k, strict=True)
        ]
        m_arr = np.array([c.local_bsz for c in cfgs])
        s_arr = np.array([c.accum_steps for c in cfgs])
        batch = np.array([c.batch_size for c in cfgs], dtype=float)
        thr = batch / predict_step_time(gm.params, all_m, all_k, m_arr, s_arr)
        good = gm.goodput(all_m, m_arr, s_arr, replicas=all_k)
    n = len(ks)
    sp_good, sp_thr = good[:n].copy(), thr[:n].copy()
    at = np.searchsorted(ks, split)
    sp_good[at], sp_thr[at] = good[n:], thr[n:]

    def curve(values: np.ndarray) -> Curve:
        points = [(float(k), float(v)) for k, v in zip(ks, values, strict=True)]
        if limit < n_max:
            points.append((float(n_max), points[-1][1]))
        return tuple(points)

    return curve(good[:n]), curve(thr[:n]), curve(sp_good), curve(sp_thr)


def best_at(gm: GoodputModel, nodes: int, replicas: int) -> GoodputConfig:
    best = gm.best_configs([nodes], replicas=[replicas])[0]
    if best is None:
        raise PolluxSimError(f"no feasible batch on {replicas} replicas over {nodes} nodes")
    return best
