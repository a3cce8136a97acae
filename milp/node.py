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
