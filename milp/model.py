"""A solver-neutral mixed-integer program, built from numpy arrays.

Formulations (``count``, ``node``) are written once against :class:`MilpBuilder`; each
solver backend translates a :class:`Milp` into its own API. SOS2 sets are kept as sets,
so a solver that really honours SOS2 uses them natively, and the others get the exact
binary-segment form from :func:`sos2_as_segments` (the curves are not concave, so lambda
weights alone would overstate the objective).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import scipy.sparse as sp

INF = float("inf")


@dataclass(frozen=True)
class Milp:
    """maximise c @ x + offset  s.t.  row_lb <= A @ x <= row_ub,  lb <= x <= ub,
    x[i] integer where ``integral[i]``, and each array in ``sos2`` an SOS2 set
    (ordered by index, at most two adjacent members non-zero). ``start``, if given, is
    a feasible x a solver may begin from (a warm start)."""

    c: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    integral: np.ndarray
    A: sp.csr_matrix
    row_lb: np.ndarray
    row_ub: np.ndarray
    sos2: tuple[np.ndarray, ...] = ()
    offset: float = 0.0
    start: np.ndarray | None = None

    @property
    def num_vars(self) -> int:
        return int(self.c.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.row_lb.shape[0])


@dataclass
class MilpBuilder:
    """Collects variable blocks and rows (as COO triples) and freezes them into a Milp."""

    _c: list[np.ndarray] = field(default_factory=list)
    _lb: list[np.ndarray] = field(default_factory=list)
    _ub: list[np.ndarray] = field(default_factory=list)
    _int: list[np.ndarray] = field(default_factory=list)
    _rows: list[np.ndarray] = field(default_factory=list)
    _cols: list[np.ndarray] = field(default_factory=list)
    _vals: list[np.ndarray] = field(default_factory=list)
    _row_lb: list[np.ndarray] = field(default_factory=list)
    _row_ub: list[np.ndarray] = field(default_factory=list)
    _sos2: list[np.ndarray] = field(default_factory=list)
    num_vars: int = 0
    num_rows: int = 0

    def add_vars(
        self,
        n: int,
        *,
        lb: float | np.ndarray = 0.0,
        ub: float | np.ndarray = INF,
        integral: bool = False,
        cost: float | np.ndarray = 0.0,
    ) -> np.ndarray:
        """Add ``n`` variables; return their indices."""
        idx = np.arange(self.num_vars, self.num_vars + n)
        self._c.append(np.broadcast_to(np.asarray(cost, float), (n,)).copy())
        self._lb.append(np.broadcast_to(np.asarray(lb, float), (n,)).copy())
        self._ub.append(np.broadcast_to(np.asarray(ub, float), (n,)).copy())
        self._int.append(np.full(n, integral))
        self.num_vars += n
        return idx

    def add_rows(
        self,
        n: int,
        rows: np.ndarray,
        cols: np.ndarray,
        vals: np.ndarray | float,
        *,
        lb: float | np.ndarray = -INF,
        ub: float | np.ndarray = INF,
    ) -> np.ndarray:
        """Add ``n`` rows; ``rows`` are 0-based within this block. Return row indices."""
        rows = np.asarray(rows, dtype=np.int64)
        self._rows.append(rows + self.num_rows)
        self._cols.append(np.asarray(cols, dtype=np.int64))
        self._vals.append(np.broadcast_to(np.asarray(vals, float), rows.shape).copy())
        self._row_lb.append(np.broadcast_to(np.asarray(lb, float), (n,)).copy())
        self._row_ub.append(np.broadcast_to(np.asarray(ub, float), (n,)).copy())
        first = self.num_rows
        self.num_rows += n
        return np.arange(first, first + n)

    def add_sos2(self, members: np.ndarray) -> None:
        self._sos2.append(np.asarray(members, dtype=np.int64))

    def build(self, offset: float = 0.0) -> Milp:
        import scipy.sparse as sp  # here: importing bftrainer.milp must not load scipy

        def cat(parts: list[np.ndarray], dtype: type = float) -> np.ndarray:
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

        A = sp.csr_matrix(
            (cat(self._vals), (cat(self._rows, np.int64), cat(self._cols, np.int64))),
            shape=(self.num_rows, self.num_vars),
        )
        A.sum_duplicates()
        return Milp(
            c=cat(self._c),
            lb=cat(self._lb),
            ub=cat(self._ub),
            integral=cat(self._int, bool),
            A=A,
            row_lb=cat(self._row_lb),
            row_ub=cat(self._row_ub),
            sos2=tuple(self._sos2),
            offset=offset,
        )


def sos2_as_segments(m: Milp) -> Milp:
    """Replace every SOS2 set by binary segment selectors (exact, solver-independent).

    For weights l_0..l_K over K segments, binaries s_1..s_K with sum s = 1 and
    l_0 <= s_1, l_k <= s_k + s_{k+1}, l_K <= s_K: only the two ends of the chosen
    segment can be non-zero.
    """
    if not m.sos2:
        return m
    integral = [m.integral]
    rows, cols, vals = [], [], []
    row_lb, row_ub = [], []
    nrow = m.num_rows
    nvar = m.num_vars
    for members in m.sos2:
        k = len(members) - 1
        if k < 1:
            continue
        seg = np.arange(nvar, nvar + k)
        nvar += k
        integral.append(np.ones(k, bool))
        # sum_s = 1
        rows.append(np.full(k, nrow))
        cols.append(seg)
        vals.append(np.ones(k))
        row_lb.append([1.0])
        row_ub.append([1.0])
        nrow += 1
        # l_i - s_i - s_{i+1} <= 0, with s_0 and s_{K+1} absent
        for i, lam in enumerate(members):
            adj = [s for s in (i - 1, i) if 0 <= s < k]
            rows.append(np.full(1 + len(adj), nrow))
            cols.append(np.concatenate(([lam], seg[adj])))
            vals.append(np.concatenate(([1.0], -np.ones(len(adj)))))
            row_lb.append([-INF])
            row_ub.append([0.0])
            nrow += 1
    import scipy.sparse as sp  # here: importing bftrainer.milp must not load scipy

    extra = nvar - m.num_vars
    coo = m.A.tocoo()
    A = sp.csr_matrix(
        (
            np.concatenate([coo.data, *vals]),
            (np.concatenate([coo.row, *rows]), np.concatenate([coo.col, *cols])),
        ),
        shape=(nrow, nvar),
    )
    return replace(
        m,
        c=np.concatenate([m.c, np.zeros(extra)]),
        lb=np.concatenate([m.lb, np.zeros(extra)]),
        ub=np.concatenate([m.ub, np.ones(extra)]),
        integral=np.concatenate(integral),
        A=A,
        row_lb=np.concatenate([m.row_lb, *map(np.asarray, row_lb)]),
        row_ub=np.concatenate([m.row_ub, *map(np.asarray, row_ub)]),
        sos2=(),
        start=None,  # the segment binaries have no start values
    )
