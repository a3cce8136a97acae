"""An exact dynamic program over the ``count`` model: a multiple-choice knapsack.

Each trainer picks one count n in {0} U [n_min, n_max] worth ``scores[n]`` (Eq. 16's
term, exact at integers); the counts share the pool's capacity. ``best[c]`` is the best
total of the trainers so far using at most ``c`` nodes; one vectorised pass per
trainer over every (capacity, count) pair. Ties keep the trainer's current count, so
equal-valued moves never cost a rescale. Exact and the fastest solver; the tests' oracle.

Memory is bounded whatever the pool and n_max: a trainer's pass runs a block of
capacities at a time (``BLOCK_CELLS``), and past ``CHOICE_CELLS`` choices the trace
back recomputes them by blocks of trainers instead of keeping them all.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from bftrainer.milp.objective import TrainerTerms, check_table

# The share of its time the DP runs before it judges its pace (the most it can waste).
PACE_SHARE = 0.05
# The most (capacity, count) cells one trainer's pass holds at once (8 MiB of values):
# a 100,000-node pool with n_max 100,000 asked for 74.5 GiB in one array before.
BLOCK_CELLS = 1 << 20
# The most choices (trainers x capacities, int32: 128 MiB) kept for the trace back. Past
# it, only the best values before every ~sqrt(trainers)-th trainer are kept and each
# block's choices are made again when traced back: one more pass, memory about
# 2 sqrt(trainers) x capacity (10,000 trainers on 100,000 nodes: 4 GB of choices, or
# 160 MB of checkpoints).
CHOICE_CELLS = 1 << 25
# Past this many kept counts, a pruned trainer's step reads a strided view over the range
# they span instead of a slice per count (about 2.5 us a slice at 1,300 capacities).
KEPT_SLICES = 8


class DeadlineError(TimeoutError):
    """The DP passed its deadline before it was done (only when given one)."""


def knapsack(
    terms: list[TrainerTerms],
    capacity: int,
    t_fwd_s: float,
    deadline: float | None = None,
    tables: Sequence[np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``best[c]`` for every capacity c in 0..capacity, and each trainer's choice table.

    ``tables``: each trainer's value per count (default ``scores(t_fwd_s)``; with slots,
    also ``low_scores``). ``deadline`` (``time.perf_counter()`` seconds): raise
    :class:`DeadlineError` once the pace so far says it would finish past it.
    """
    choices = np.zeros((len(terms), capacity + 1), dtype=np.int32)
    best = _run(
        terms, Tables(terms, t_fwd_s, tables), None, np.zeros(capacity + 1), deadline, choices
    )
    return best, choices


def best_values(term: TrainerTerms, trainers: int, capacity: int, t_fwd_s: float) -> np.ndarray:
    """``best[c]`` of ``knapsack`` over ``trainers`` copies of ``term``, without choices:
    memory ~ capacity. Work ends once a copy changes nothing (every later one would
    change nothing either), and at ``capacity`` copies (each takes a node or nothing)."""
    scores = term.scores(t_fwd_s)[: capacity + 1]
    best = np.zeros(capacity + 1)
    for _ in range(min(trainers, capacity)):
        after = _step(best, scores, None, term.c, None)[0]
        if np.array_equal(after, best):
            break
        best = after
    return best


def dp_cells(terms: list[TrainerTerms], pool_size: int) -> int:
    """The size of the DP's work, (capacity, count) pairs over all trainers: about
    2 ns each here (100 trainers of n_max 64 on 4,608 nodes: 3e7 pairs in 55 ms)."""
    cap = min(pool_size, sum(t.n_max for t in terms))
    return sum((cap + 1) * (min(t.n_max, cap) + 1) for t in terms)


def solve_counts(
    terms: list[TrainerTerms],
    pool_size: int,
    t_fwd_s: float,
    deadline: float | None = None,
    tables: Sequence[np.ndarray] | None = None,
) -> tuple[dict[str, int], float]:
    """The optimal count per trainer and its objective value (``deadline``, ``tables``:
    see knapsack). ``pool_size`` is the capacity: nodes, or slots with S > 1."""
    cap = min(pool_size, sum(t.n_max for t in terms))
    return _solve(terms, Tables(terms, t_fwd_s, tables), None, cap, deadline)


def solve_counts_pruned(
    terms: list[TrainerTerms],
    pool_size: int,
    t_fwd_s: float,
    incumbent: dict[str, int],
    deadline: float | None = None,
    tables: Sequence[np.ndarray] | None = None,
    floor: float | None = None,
) -> tuple[dict[str, int], float]:
    """``solve_counts``, exact too, over only the counts that can win (``bound.py``)
    against ``incumbent``, a feasible count per trainer: every optimal answer uses only
    those. The work is capacity x kept counts, not capacity x n_max: with slots the
    capacity is |N| x S and n_max counts slots (30 x 4,800 x 385 pairs unpruned).

    ``tables``: as in ``knapsack``. ``floor`` (default: the incumbent's value) prunes
    against a higher mark, a value known to be reached otherwise: the answer is then
    the optimum if that is worth ``floor`` or more, else no worse than ``incumbent``.
    """
    from bftrainer.milp.bound import counts_that_can_win

    cap = min(pool_size, sum(t.n_max for t in terms))
    if tables is None:
        tables = [t.scores(t_fwd_s) for t in terms]
    reached = sum(float(s[incumbent.get(t.id, 0)]) for t, s in zip(terms, tables, strict=True))
    kept = counts_that_can_win(list(tables), cap, reached if floor is None else max(floor, reached))
    options = []
    for j, t in enumerate(terms):
        scores = tables[j]
        extra = [n for n in (incumbent.get(t.id, 0), t.c) if n <= min(cap, t.n_max)]
        counts = np.union1d(kept[j], extra).astype(np.int64)
        options.append(counts[(counts <= cap) & np.isfinite(scores[counts])])
    return _solve(terms, Tables(terms, t_fwd_s, tables), options, cap, deadline)


class Tables:
    """Each trainer's value per count, read when its turn comes (``scores`` of a large
    problem is itself work that the deadline must see), or as given."""

    def __init__(
        self, terms: Sequence[TrainerTerms], t_fwd_s: float, given: Sequence[np.ndarray] | None
    ) -> None:
        self.terms, self.t_fwd_s, self.given = terms, t_fwd_s, given

    def __getitem__(self, j: int) -> np.ndarray:
        if self.given is None:
            return self.terms[j].scores(self.t_fwd_s)  # checked once, where computed
        table = self.given[j]
        check_table(self.terms[j].id, table)
        return table

    def part(self, start: int, end: int) -> Tables:
        given = None if self.given is None else self.given[start:end]
        return Tables(self.terms[start:end], self.t_fwd_s, given)


Options = Sequence[np.ndarray] | None


def _solve(
    terms: Sequence[TrainerTerms],
    tables: Tables,
    options: Options,
    cap: int,
    deadline: float | None,
) -> tuple[dict[str, int], float]:
    """The counts and value at capacity ``cap``: every choice kept when they fit in
    ``CHOICE_CELLS``; else checkpoints every ``every`` trainers, and each block's
    choices made again, last block first, as its trace back needs them."""
    if not terms:
        return {}, 0.0
    if options is None and cap == sum(t.n_max for t in terms):
        unbound = _solve_unbound(terms, tables)
        if unbound is not None:
            return unbound
    every = len(terms)
    if len(terms) * (cap + 1) > CHOICE_CELLS:
        every = max(1, min(math.isqrt(len(terms)), CHOICE_CELLS // (cap + 1)))
    kept_all = every == len(terms)
    checkpoints: dict[int, np.ndarray] = {}
    choices = np.zeros((every, cap + 1), dtype=np.int32) if kept_all else None
    spans = _spans(terms, cap)
    best = _run(
        terms, tables, options, np.zeros(cap + 1), deadline, choices, checkpoints, every, spans
    )
    counts: dict[str, int] = {}
    c = cap
    for start in sorted(checkpoints, reverse=True):
        end = start + every
        if not kept_all:
            choices = np.zeros((min(every, len(terms) - start), cap + 1), dtype=np.int32)
            _run(
                terms[start:end],
                tables.part(start, end),
                None if options is None else options[start:end],
                checkpoints[start],
                deadline,
                choices,
                spans=spans[start:end],
            )
        assert choices is not None
        for j in range(len(choices) - 1, -1, -1):
            n = int(choices[j, c])
            counts[terms[start + j].id] = n
            c -= n
    return {t.id: counts[t.id] for t in terms}, float(best[cap])


def _solve_unbound(
    terms: Sequence[TrainerTerms], tables: Tables
) -> tuple[dict[str, int], float] | None:
    """``_solve`` when the capacity is every trainer's n_max summed (the pool holds all
    at their most: a replay's usual case on a large machine), by the same sums.

    Then ``_spans`` gives each trainer one capacity, hi = the n_max of trainers 0..j
    summed, and the trace back reads each trainer's count there: at hi every count n
    reads best[hi - n] >= hi's of the trainer before, all the same value (the best so
    far, copied upwards). So each step is that value plus the trainer's scores, its
    first best count, the current one among equals: the DP's own additions and ties,
    without its arrays. None (use the DP) if a table is not one entry per count."""
    total = 0.0
    counts: dict[str, int] = {}
    for j, t in enumerate(terms):
        scores = tables[j]
        if len(scores) != t.n_max + 1:
            return None
        value = total + scores
        n = int(value.argmax())  # the smallest count among equals
        total = value[n]  # the DP's best there (this entry, as it takes it)
        if t.c < len(value) and value[t.c] == total:
            n = t.c  # ...but the current count first: moving must strictly pay
        counts[t.id] = n
    return counts, float(total)


def _run(
    terms: Sequence[TrainerTerms],
    tables: Tables,
    options: Options,
    best: np.ndarray,
    deadline: float | None,
    choices: np.ndarray | None,
    checkpoints: dict[int, np.ndarray] | None = None,
    every: int = 0,
    spans: Sequence[tuple[int, int]] | None = None,
) -> np.ndarray:
    """One pass over ``terms`` from ``best``: each trainer's count per capacity into
    ``choices`` (when given), and ``best`` before trainer j into ``checkpoints`` for
    every j divisible by ``every``; ``spans``: only the capacities ``_spans`` names."""
    began = time.perf_counter()
    first_done = math.nan
    # Give up as soon as the pace says it cannot make it, not at the deadline; but judge
    # the pace only after the first trainer, which pays a fresh process's warm-up, and
    # once a share of the time has passed. Judged from the first trainers, a 10,000-
    # trainer DP that takes 2 s gave up at once in about half of fresh processes.
    judge_from = math.inf if deadline is None else began + PACE_SHARE * (deadline - began)
    for j, t in enumerate(terms):
        if deadline is not None and j:
            now = time.perf_counter()
            late = now > deadline
            if j > 1 and now >= judge_from:
                late = late or now + (now - first_done) * (len(terms) - j) / (j - 1) > deadline
            if late:
                raise DeadlineError(
                    f"the DP would pass its deadline ({j} of {len(terms)} trainers done)"
                )
        if checkpoints is not None and every and j % every == 0:
            checkpoints[j] = best
        span = None if spans is None else spans[j]
        best, pick = _step(
            best, tables[j], None if options is None else options[j], t.c, deadline, span
        )
        if choices is not None and j < len(choices):
            choices[j] = pick
        if j == 0:
            first_done = time.perf_counter()
    return best


def _spans(terms: Sequence[TrainerTerms], cap: int) -> list[tuple[int, int]]:
    """Per trainer, the capacities [lo, hi] the trace back from ``cap`` can need.

    Trainer j never sees fewer than lo = cap - (the later trainers' n_max summed) nodes
    left, and above hi = the n_max of trainers 0..j summed every capacity has the same
    value and count as hi (what the earlier ones can take is all taken): ``_step``
    computes [lo, hi] only, and copies hi upwards. The same values and counts wherever
    they are read; a third of the work at 10 trainers on a tight pool."""
    n_max = [t.n_max for t in terms]
    after = sum(n_max)
    before = 0
    spans = []
    for n in n_max:
        after -= n
        before += n
        spans.append((max(0, cap - after), min(cap, before)))
    return spans


def _step(
    best: np.ndarray,
    scores: np.ndarray,
    options: np.ndarray | None,
    current: int,
    deadline: float | None,
    span: tuple[int, int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One trainer added: the new ``best`` and the count it takes at each capacity.

    value[c, i] = best[c - n_i] + scores[n_i]: n_i nodes to this trainer, c in all (or
    in ``span``, see ``_spans``: -inf below it, hi's values above), for every count
    (``options`` None) or the given ones; a block of capacities at a time."""
    capacity = len(best) - 1
    first, last = (0, capacity) if span is None else span
    if options is None:
        k = len(scores)
        padded = np.concatenate([np.full(k - 1, -np.inf), best])
        # windows[c, i] = padded[k - 1 + c - i] = best[c - i]: a view, nothing copied
        # (sliding_window_view's checks cost more than the rest of a small step).
        size = padded.itemsize
        windows = np.ndarray((capacity + 1, k), padded.dtype, padded, (k - 1) * size, (size, -size))
        gains = scores
        at_current = current if current < k else -1
    else:
        k = len(options)
        # best after capacity + 1 -inf (the many-count layout's strided view reads it)
        padded = np.concatenate([np.full(capacity + 1, -np.inf), best]) if k > KEPT_SLICES else best
        gains = scores[options]
        found = np.flatnonzero(options == current)
        at_current = int(found[0]) if found.size else -1
    # The cells a block holds at once: many kept counts are read over the range they span.
    width = k if options is None or k <= KEPT_SLICES else int(options[-1] - options[0]) + 1
    new_best = np.empty(capacity + 1)
    pick = np.empty(capacity + 1, dtype=np.int32)
    rows = max(1, BLOCK_CELLS // max(width, 1))
    for lo in range(first, last + 1, rows):
        if deadline is not None and lo > first and time.perf_counter() > deadline:
            raise DeadlineError(f"the DP passed its deadline (capacity {lo} of {capacity})")
        hi = min(lo + rows, last + 1)
        if options is None:
            value = windows[lo:hi] + gains
            p = value.argmax(axis=1)  # the smallest count among equals
            b = value[np.arange(hi - lo), p]
            if at_current >= 0:  # ...but the current count first: moving must strictly pay
                p[value[:, at_current] == b] = at_current
            new_best[lo:hi] = b
            pick[lo:hi] = p
        elif k <= KEPT_SLICES:
            _kept_slices(best, gains, options, at_current, new_best[lo:hi], pick[lo:hi], lo)
        else:
            new_best[lo:hi], pick[lo:hi] = _kept_block(padded, gains, options, at_current, lo, hi)
    new_best[:first] = -np.inf  # never read (see _spans)
    pick[:first] = 0
    new_best[last + 1 :] = new_best[last]
    pick[last + 1 :] = pick[last]
    return new_best, pick


def _kept_slices(
    best: np.ndarray,
    gains: np.ndarray,
    options: np.ndarray,
    at_current: int,
    value: np.ndarray,
    pick: np.ndarray,
    lo: int,
) -> None:
    """``_step`` over a few kept counts (a pruned trainer keeps one or a few of its 65)
    at capacities lo..lo+len(value)-1, into ``value`` and ``pick``: a running maximum,
    one slice of ``best`` per count, no (capacities x counts) array. The same values
    and ties as the full step: the smallest kept count among equals (a later count must
    be strictly better), the current one first; -inf cells pick as argmax would."""
    hi = lo + len(value)
    counts = options.tolist()
    value.fill(-np.inf)
    pick.fill(counts[0])
    for n, g in zip(counts, gains.tolist(), strict=True):
        start = max(lo, n)  # best[c - n] is -inf below n
        if start >= hi:
            break
        cand = best[start - n : hi - n] + g
        mine = value[start - lo :]
        better = cand > mine
        np.copyto(mine, cand, where=better)
        pick[start - lo :][better] = n
    if at_current >= 0:  # ...but the current count first: moving must strictly pay
        n = counts[at_current]
        start = min(max(lo, n), hi)
        pick[: start - lo][value[: start - lo] == -np.inf] = n
        same = best[start - n : hi - n] + gains[at_current] == value[start - lo :]
        pick[start - lo :][same] = n


def _kept_block(
    padded: np.ndarray, gains: np.ndarray, options: np.ndarray, at_current: int, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray]:
    """``_step``'s values and counts at capacities lo..hi-1 over many kept counts
    ``options`` (ascending), ``padded`` being best after capacity + 1 -inf: a strided
    view over the range they span, -inf gains for the counts not kept (gathering them by
    index cost 3-6x more). The same ties as the full step: the smallest kept count among
    equals, the current one first."""
    shift = len(padded) // 2  # capacity + 1: best[c - n] = padded[c - n + shift]
    n0 = int(options[0])
    span = int(options[-1]) - n0 + 1
    masked = np.full(span, -np.inf)
    masked[options - n0] = gains
    size = padded.itemsize
    # window[r, i] = padded[lo + r - n0 - i + shift] = best[lo + r - (n0 + i)]: a view
    window = np.ndarray(
        (hi - lo, span), padded.dtype, padded, (lo - n0 + shift) * size, (size, -size)
    )
    value = window + masked
    p = value.argmax(axis=1)  # the smallest count among equals (-inf: never one kept)
    b = value[np.arange(hi - lo), p]
    if at_current >= 0:
        at = int(options[at_current]) - n0
        p[value[:, at] == b] = at
    return b, (p + n0).astype(np.int32)
