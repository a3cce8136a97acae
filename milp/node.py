"""The ``node`` formulation: the BFTrainer paper's per-node model (Liu et al. 2021, §3).

The reference model, and the base for node-dependent extensions (topology, per-node
expected idle time). Binary x_jn says node n goes to trainer j. Rows, by their role
in the paper:

    (exclusive)   sum_j x_jn <= 1                                for every node n
    (job size)    n_min_j z_j <= N_j <= n_max_j z_j,  N_j = sum_n x_jn
    (no migration, XOR on g_j)
                  g_j = 1 (grow or stay): keeps every current node,
                        sum_{n in cur_j} x_jn >= C_j g_j
                  g_j = 0 (shrink): takes no new node,
                        sum_{n not in cur_j} x_jn <= n_max_j g_j
    (indicators)  N_j - C_j <= (n_max_j - C_j) up_j,   C_j - N_j <= C_j dw_j
    (curve)       N_j = sum_k x_k lambda_jk, sum_k lambda_jk = 1, SOS2(lambda_j)
    (objective)   Eq. 16: T_fwd sum_jk y_jk lambda_jk - sum_j O_j(C_j)(R_up up_j + R_dw dw_j)

Every big-M above is the tightest valid one for its row (C_j or n_max_j). The paper's
own code used M = |N| + 1 in a combined form |d| + S <= M, which needs
M >= 2 max(n_max, C_j) and cut off optimal solutions (see docs/allocator.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bftrainer.milp.model import Milp, MilpBuilder
from bftrainer.milp.objective import TrainerTerms


@dataclass(frozen=True)
class NodeModel:
    milp: Milp
    x_start: int
    pool: tuple[str, ...]

    def node_sets(self, x: np.ndarray, terms: list[TrainerTerms]) -> dict[str, tuple[str, ...]]:
        p = len(self.pool)
        xs = x[self.x_start : self.x_start + len(terms) * p].reshape(len(terms), p) > 0.5
        return {
            t.id: tuple(self.pool[i] for i in np.flatnonzero(xs[j])) for j, t in enumerate(terms)
        }


def build_node_model(terms: list[TrainerTerms], pool: tuple[str, ...], t_fwd_s: float) -> NodeModel:
    J, P = len(terms), len(pool)
    where = {node: i for i, node in enumerate(pool)}
    cur = np.zeros((J, P), dtype=bool)
    for j, t in enumerate(terms):
        cur[j, [where[n] for n in t.current]] = True
    n_max = np.array([t.n_max for t in terms], float)
    n_min = np.array([t.n_min for t in terms], float)
    c = np.array([t.c for t in terms], float)
    o_c = np.array([t.current_value for t in terms], float)

    b = MilpBuilder()
    x = b.add_vars(J * P, ub=np.repeat((n_max > 0).astype(float), P), integral=True)
    z = b.add_vars(J, ub=np.array([float(t.runnable) for t in terms]), integral=True)
    g = b.add_vars(J, ub=1.0, integral=True)
    up = b.add_vars(J, ub=1.0, integral=True, cost=-o_c * np.array([t.rescale_up_s for t in terms]))
    dw = b.add_vars(
        J, ub=1.0, integral=True, cost=-o_c * np.array([t.rescale_down_s for t in terms])
    )
    xjn = x.reshape(J, P)
    rows_j = np.repeat(np.arange(J), P)

    def n_j_plus(other: np.ndarray, coef: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """COO triples of the J rows  N_j + coef_j * other_j."""
        return (
            np.concatenate([rows_j, np.arange(J)]),
            np.concatenate([x, other]),
            np.concatenate([np.ones(J * P), coef]),
        )

    # (exclusive) every node to at most one trainer.
    b.add_rows(P, np.tile(np.arange(P), J), x, 1.0, ub=1.0)
    # (job size)
    b.add_rows(J, *n_j_plus(z, -n_min), lb=0.0)
    b.add_rows(J, *n_j_plus(z, -n_max), ub=0.0)
    # (no migration) grow mode keeps all current nodes; shrink mode takes no new one.
    jj, pp = np.nonzero(cur)
    b.add_rows(
        J,
        np.concatenate([jj, np.arange(J)]),
        np.concatenate([xjn[jj, pp], g]),
        np.concatenate([np.ones(len(jj)), -c]),
        lb=0.0,
    )
    jj, pp = np.nonzero(~cur)
    b.add_rows(
        J,
        np.concatenate([jj, np.arange(J)]),
        np.concatenate([xjn[jj, pp], g]),
        np.concatenate([np.ones(len(jj)), -n_max]),
        ub=0.0,
    )
    # (indicators)
    b.add_rows(J, *n_j_plus(up, -np.maximum(n_max - c, 0.0)), ub=c)
    b.add_rows(J, *n_j_plus(dw, c), lb=c)
    # (curve) SOS2 over each trainer's breakpoints.
    for j, t in enumerate(terms):
        lam = b.add_vars(len(t.bp_nodes), ub=1.0, cost=t_fwd_s * t.bp_value)
        k = len(lam)
        b.add_rows(
            1,
            np.zeros(P + k),
            np.concatenate([xjn[j], lam]),
            np.concatenate([np.ones(P), -t.bp_nodes]),
            lb=0.0,
            ub=0.0,
        )
        b.add_rows(1, np.zeros(k), lam, 1.0, lb=1.0, ub=1.0)
        b.add_sos2(lam)
    return NodeModel(milp=b.build(), x_start=int(x[0]) if J * P else 0, pool=pool)


@dataclass(frozen=True)
class SlotModel:
    milp: Milp
    x_start: int
    pool: tuple[str, ...]

    def holdings(self, x: np.ndarray, terms: list[TrainerTerms]) -> dict[str, tuple[str, ...]]:
        p = len(self.pool)
        xs = np.rint(x[self.x_start : self.x_start + len(terms) * p]).astype(int)
        xs = xs.reshape(len(terms), p)
        return {
            t.id: tuple(self.pool[i] for i in range(p) for _ in range(max(xs[j, i], 0)))
            for j, t in enumerate(terms)
        }


def build_slot_model(
    terms: list[TrainerTerms], pool: tuple[str, ...], slots_per_node: int, t_fwd_s: float
) -> SlotModel:
    """The node model with S slots per node (docs/allocator.md, "Slots"): exact, the
    reference the count model's bound is checked against. Integer x_jn in 0..S slots of
    node n to trainer j, binary y_jn (j uses node n), one binary w_jk per allowed count
    k and q_jk (count k, packed: on at most ceil(k/S) nodes):

        (capacity)      sum_j x_jn <= S
        (uses)          x_jn <= S y_jn
        (count)         sum_n x_jn = sum_k k w_jk,  sum_k w_jk = 1,  q_jk <= w_jk
        (packed)        sum_n y_jn <= sum_k ceil(k/S) w_jk + |N| (1 - sum_k q_jk)
        (no migration)  x_jn >= c_jn g_j,  x_jn <= c_jn + S g_j   (g_j: grow or stay)
        (objective)     sum_jk w_jk s_j(k, spread) + q_jk (s_j(k, packed) - s_j(k, spread))

    where s_j is Eq. 16's term at that placement (the rescale cost depends on k only).
    """
    J, P, S = len(terms), len(pool), slots_per_node
    where = {node: i for i, node in enumerate(pool)}
    cur = np.zeros((J, P))
    for j, t in enumerate(terms):
        for n in t.current:
            cur[j, where[n]] += 1
    b = MilpBuilder()
    x = b.add_vars(J * P, ub=float(S), integral=True)
    y = b.add_vars(J * P, ub=1.0, integral=True)
    g = b.add_vars(J, ub=1.0, integral=True)
    xjn = x.reshape(J, P)
    # (capacity) and (uses)
    b.add_rows(P, np.tile(np.arange(P), J), x, 1.0, ub=float(S))
    b.add_rows(
        J * P,
        np.repeat(np.arange(J * P), 2),
        np.ravel(np.column_stack([x, y])),
        np.tile([1.0, -S], J * P),
        ub=0.0,
    )
    # (no migration), per node
    jj, pp = np.nonzero(cur)
    b.add_rows(
        len(jj),
        np.repeat(np.arange(len(jj)), 2),
        np.ravel(np.column_stack([xjn[jj, pp], g[jj]])),
        np.ravel(np.column_stack([np.ones(len(jj)), -cur[jj, pp]])),
        lb=0.0,
    )
    b.add_rows(
        J * P,
        np.repeat(np.arange(J * P), 2),
        np.ravel(np.column_stack([x, np.repeat(g, P)])),
        np.tile([1.0, -S], J * P),
        ub=cur.ravel(),
    )
    for j, t in enumerate(terms):
        assert t.packed_value is not None and t.spread_value is not None
        packed = t.eq16_terms(t_fwd_s, t.packed_value)
        spread = t.eq16_terms(t_fwd_s, t.spread_value)
        ks = np.flatnonzero(np.isfinite(packed))
        w = b.add_vars(len(ks), ub=1.0, integral=True, cost=spread[ks])
        q = b.add_vars(len(ks), ub=1.0, integral=True, cost=packed[ks] - spread[ks])
        b.add_rows(1, np.zeros(len(ks)), w, 1.0, lb=1.0, ub=1.0)
        b.add_rows(
            len(ks),
            np.tile(np.arange(len(ks)), 2),
            np.concatenate([q, w]),
            np.repeat([1.0, -1.0], len(ks)),
            ub=0.0,
        )
        b.add_rows(
            1,
            np.zeros(P + len(ks)),
            np.concatenate([xjn[j], w]),
            np.concatenate([np.ones(P), -ks.astype(float)]),
            lb=0.0,
            ub=0.0,
        )
        need = np.array([-(-int(k) // S) for k in ks], float)
        b.add_rows(
            1,
            np.zeros(P + 2 * len(ks)),
            np.concatenate([y[j * P : (j + 1) * P], w, q]),
            np.concatenate([np.ones(P), -need, np.full(len(ks), float(P))]),
            ub=float(P),
        )
    return SlotModel(milp=b.build(), x_start=int(x[0]) if J * P else 0, pool=pool)
