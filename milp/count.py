"""The ``count`` formulation: decide only how many nodes each trainer gets.

Idle nodes are interchangeable, and without migration a count vector N is realisable by
a node map exactly when sum_j N_j <= |pool| (each trainer keeps min(C_j, N_j) of its
current nodes; growers take free and released nodes; see ``mapping.py``). So this model
has the same optimum as the paper's per-node model with J integer variables instead of
J x |N| binaries. Variables per trainer j, named as in the paper:

    N_j   integer nodes,  z_j  runs (0 or n_min..n_max),
    up_j / dw_j  scale-up / scale-down indicators,
    lambda_jk  SOS2 weights over the breakpoints of O_j.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from bftrainer.milp.model import Milp, MilpBuilder
from bftrainer.milp.objective import TrainerTerms


@dataclass(frozen=True)
class CountModel:
    milp: Milp
    n_index: np.ndarray  # column of N_j per trainer, in terms order

    def counts(self, x: np.ndarray, terms: list[TrainerTerms]) -> dict[str, int]:
        return {t.id: round(float(x[i])) for t, i in zip(terms, self.n_index, strict=True)}


def build_count_model(terms: list[TrainerTerms], pool_size: int, t_fwd_s: float) -> CountModel:
    b = MilpBuilder()
    n_index = []
    cap_cols = []
    for t in terms:
        n = b.add_vars(1, ub=t.n_max, integral=True)
        z = b.add_vars(1, ub=1.0 if t.runnable else 0.0, integral=True)
        cost = t.current_value
        up = b.add_vars(1, ub=1.0, integral=True, cost=-cost * t.rescale_up_s)
        dw = b.add_vars(1, ub=1.0, integral=True, cost=-cost * t.rescale_down_s)
        lam = b.add_vars(len(t.bp_nodes), ub=1.0, cost=t_fwd_s * t.bp_value)
        n_index.append(int(n[0]))
        cap_cols.append(n)

        # Job size: N_j = 0, or n_min <= N_j <= n_max (z_j = 1).
        b.add_rows(1, [0, 0], [n[0], z[0]], [1.0, -t.n_min], lb=0.0)
        b.add_rows(1, [0, 0], [n[0], z[0]], [1.0, -float(t.n_max)], ub=0.0)
        # O_j(N_j) by SOS2 over the breakpoints: N_j = sum_k x_k lambda_k, sum lambda = 1.
        k = len(lam)
        b.add_rows(
            1, np.zeros(k + 1), np.append(n, lam), np.append(1.0, -t.bp_nodes), lb=0.0, ub=0.0
        )
        b.add_rows(1, np.zeros(k), lam, 1.0, lb=1.0, ub=1.0)
        b.add_sos2(lam)
        # Rescale indicators (Eq. 16's R_j): N_j > C_j forces up_j, N_j < C_j forces dw_j.
        b.add_rows(1, [0, 0], [n[0], up[0]], [1.0, -float(max(t.n_max - t.c, 0))], ub=float(t.c))
        b.add_rows(1, [0, 0], [n[0], dw[0]], [1.0, float(t.c)], lb=float(t.c))
    # Capacity: sum_j N_j <= |pool| (with no migration, the node-level constraints reduce
    # to this; see the module docstring).
    if cap_cols:
        cols = np.concatenate(cap_cols)
        b.add_rows(1, np.zeros(len(cols)), cols, 1.0, ub=float(pool_size))
    return CountModel(milp=b.build(), n_index=np.array(n_index, dtype=np.int64))
