"""Random small allocation problems for property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from bftrainer.milp import Problem, TrainerSpec


@st.composite
def curves(draw: st.DrawFn, n_max: int) -> tuple[tuple[float, float], ...]:
    """Random non-concave, non-decreasing curves whose last breakpoint reaches n_max."""
    xs = sorted(draw(st.sets(st.integers(1, n_max), min_size=0, max_size=3)) | {n_max})
    values, v = [], 0.0
    for _ in xs:
        v += draw(st.floats(0.0, 100.0, allow_nan=False))
        values.append(round(v, 3))
    return tuple(zip((float(x) for x in xs), values, strict=True))


# fair_weights weigh users or accounts: by trainer a problem refuses them.
WEIGHTS = ({}, {"ann": 2.0}, {"bob": 0.5, "phys": 3.0})


@st.composite
def problems(draw: st.DrawFn, max_pool: int = 8, max_trainers: int = 4) -> Problem:
    pool = [f"n{i}" for i in range(draw(st.integers(0, max_pool)))]
    gone = [f"gone{i}" for i in range(3)]  # nodes that left the pool
    free = pool + gone
    trainers = []
    for j in range(draw(st.integers(0, max_trainers))):
        n_min = draw(st.integers(1, 3))
        n_max = draw(st.integers(n_min, 6))
        k = draw(st.integers(0, min(n_max, len(free))))
        held = draw(st.permutations(free))[:k] if k else []
        free = [n for n in free if n not in held]
        trainers.append(
            TrainerSpec(
                id=f"t{j}",
                n_min=n_min,
                n_max=n_max,
                rescale_up_s=draw(st.integers(0, 600)) / 10,
                rescale_down_s=draw(st.integers(0, 600)) / 10,
                curve=draw(curves(n_max)),
                nodes=tuple(held),
                user=draw(st.sampled_from(["", "ann", "bob"])),
                account=draw(st.sampled_from(["", "phys"])),
            )
        )
    fair_by = draw(st.sampled_from(["trainer", "trainer", "user", "account"]))
    weights = {} if fair_by == "trainer" else draw(st.sampled_from(WEIGHTS))
    return Problem(
        pool=tuple(pool),
        trainers=tuple(trainers),
        t_fwd_s=float(draw(st.integers(1, 300))),
        objective=draw(st.sampled_from(["throughput", "speedup", "goodput"])),
        fairness_p=draw(st.sampled_from([1.0, 1.0, 0.5, 0.0, -1.0, -3.0])),
        fair_share_speedup=draw(st.booleans()),
        max_trainers=draw(st.integers(1, 4)),
        fair_by=fair_by,
        fair_weights=weights,
    )
