"""HiGHS through highspy: the default solver (free, embedded, no subprocess).

HiGHS has no SOS constraints, so SOS2 sets become binary segments. The model is passed
as CSR arrays in one call, the fast way to build. The objective is scaled to a largest
coefficient of 1 (Eq. 16's are ~1e8 samples), which kept HiGHS' tolerances meaningful
and cut its time at 100 x 4,608 by about a third.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from bftrainer.milp.model import Milp, sos2_as_segments
from bftrainer.milp.solvers.base import DEFAULT_MIP_GAP, SolveOutcome, SolverError, SolveStatus

log = logging.getLogger(__name__)

# HiGHS' presolve costs more than it saves on small models and pays off on large ones.
# Measured on the allocator benchmark (CPU ms, median of 5 seeds, same optima): with
# presolve off 10x100 (650 columns) 43 -> 11, 30x800 (1,950) 48 -> 13, but 100x4608
# (6,500) 416 -> 1,912; on the Summit replay's own problems (~470 columns) the median
# fell from 37 to 8 ms and the mean stayed the same.
PRESOLVE_OFF_MAX_COLUMNS = 3000
# ...but HiGHS's presolve never looks at the clock: at 10,000 trainers (650,000 columns)
# it ran 11 s against a 3 s limit. Past this size presolve is off, and a callback
# interrupts the solve at the limit (the solver's own check comes seconds late there).
PRESOLVE_ON_MAX_COLUMNS = 100_000
# A large model spends seconds to tens of seconds in phases that check neither the clock
# nor the callback (650,000 columns: 47 s against an 8 s limit; 195,000: 9 s against 2 s;
# 97,500 with presolve: 15 s against 10 s). Past this size it is attempted only with at
# least LARGE_MODEL_MIN_LIMIT_S; otherwise the allocator's exact DP or greedy fallback
# answers within the limit.
UNBOUNDED_MIN_COLUMNS = 20_000
LARGE_MODEL_MIN_LIMIT_S = 60.0
_HEURISTICS_OFF = (
    "mip_heuristic_run_feasibility_jump",
    "mip_heuristic_run_rins",
    "mip_heuristic_run_rens",
    "mip_heuristic_run_root_reduced_cost",
)


class HighsSolver:
    name = "highs"
    native_sos2 = False

    def solve(
        self,
        milp: Milp,
        *,
        time_limit_s: float,
        mip_gap: float = DEFAULT_MIP_GAP,
        integrality_tolerance: float | None = None,
    ) -> SolveOutcome:
        import highspy

        start = time.perf_counter()
        m = sos2_as_segments(milp)
        large = m.num_vars > PRESOLVE_ON_MAX_COLUMNS
        if m.num_vars > UNBOUNDED_MIN_COLUMNS and time_limit_s < LARGE_MODEL_MIN_LIMIT_S:
            log.warning(
                "HiGHS not run: %d columns cannot be stopped at a %.3g s limit (needs %g s)",
                m.num_vars,
                time_limit_s,
                LARGE_MODEL_MIN_LIMIT_S,
            )
            return SolveOutcome(SolveStatus.TIME_LIMIT, None, None, None, 0.0)
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("mip_rel_gap", float(mip_gap))
        # The relative gap alone decides: gains can be tiny beside a rescale cost.
        h.setOptionValue("mip_abs_gap", 0.0)
        if integrality_tolerance is not None:
            h.setOptionValue("mip_feasibility_tolerance", float(integrality_tolerance))
        if m.num_vars <= PRESOLVE_OFF_MAX_COLUMNS or large:
            h.setOptionValue("presolve", "off")
        inf = highspy.kHighsInf
        A = m.A
        scale = float(np.abs(m.c).max()) if m.num_vars and np.abs(m.c).max() > 0 else 1.0
        status = h.passModel(
            m.num_vars,
            m.num_rows,
            int(A.nnz),
            2,  # row-wise (CSR)
            -1,  # maximise
            float(m.offset) / scale,
            m.c / scale,
            np.clip(m.lb, -inf, inf),
            np.clip(m.ub, -inf, inf),
            np.clip(m.row_lb, -inf, inf),
            np.clip(m.row_ub, -inf, inf),
            A.indptr.astype(np.int32),
            A.indices.astype(np.int32),
            A.data.astype(float),
            m.integral.astype(np.int32),
        )
        if status == highspy.HighsStatus.kError:
            raise SolverError("HiGHS rejected the model")
        # The limit covers passing the model too (seconds at 10,000 trainers).
        remaining_s = time_limit_s - (time.perf_counter() - start)
        if remaining_s <= 0:
            return SolveOutcome(
                SolveStatus.TIME_LIMIT, None, None, None, time.perf_counter() - start
            )
        h.setOptionValue("time_limit", float(remaining_s))
        if m.start is not None:
            # A start (the exact DP's answer) leaves HiGHS only the proof: its primal
            # heuristics would search for what it already has. At 30 x 800 on random
            # instances: median 9 ms against 13 with them (docs/benchmarks.md).
            solution = highspy.HighsSolution()
            solution.col_value = m.start.tolist()
            solution.value_valid = True
            h.setSolution(solution)
            for option in _HEURISTICS_OFF:
                h.setOptionValue(option, False)
            h.setOptionValue("mip_heuristic_effort", 0.0)
        if large:
            deadline = time.perf_counter() + remaining_s

            def stop_at_limit(event: Any) -> None:  # a HighsCallbackEvent
                if time.perf_counter() > deadline:
                    event.interrupt()

            h.cbSimplexInterrupt += stop_at_limit
            h.cbIpmInterrupt += stop_at_limit
            h.cbMipInterrupt += stop_at_limit
        h.run()
        model_status = h.getModelStatus()
        info = h.getInfo()
        has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
        x = np.array(h.getSolution().col_value)[: milp.num_vars] if has_solution else None
        objective = float(info.objective_function_value) * scale if has_solution else None
        bound = float(info.mip_dual_bound) * scale if np.isfinite(info.mip_dual_bound) else None
        elapsed = time.perf_counter() - start
        ms = highspy.HighsModelStatus
        if model_status == ms.kOptimal:
            return SolveOutcome(SolveStatus.OPTIMAL, x, objective, bound, elapsed)
        if model_status == ms.kInfeasible:
            return SolveOutcome(SolveStatus.INFEASIBLE, None, None, None, elapsed)
        if model_status in (ms.kTimeLimit, ms.kInterrupt, ms.kIterationLimit, ms.kSolutionLimit):
            return SolveOutcome(SolveStatus.TIME_LIMIT, x, objective, bound, elapsed)
        raise SolverError(f"HiGHS ended with status {h.modelStatusToString(model_status)}")
