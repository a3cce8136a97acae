"""The centre soak's schedule (tests/bftrainer/centre_soak.py): the same seed replays the
same run, and the long runs of benchmarks/centre_soak.py meet every fault and every kind
of cross-user request. The soak itself needs root, real accounts and minutes: it runs as
the benchmark."""

from __future__ import annotations

from tests.bftrainer.centre_soak import KINDS, VERBS, schedule


def test_schedules_are_reproducible() -> None:
    a = schedule(1, 900.0, 3, 8, 45.0)
    assert a == schedule(1, 900.0, 3, 8, 45.0)
    assert a != schedule(2, 900.0, 3, 8, 45.0)


def test_every_user_submits_first_and_asks_only_about_others() -> None:
    for seed in range(1, 6):
        actions = schedule(seed, 900.0, 3, 8, 45.0)
        assert [(a.kind, a.args["user"]) for a in actions[:3]] == [
            ("submit", 0),
            ("submit", 1),
            ("submit", 2),
        ]
        for a in actions:
            assert 0 <= a.args["user"] < 3
            if a.kind == "cross_user":
                assert a.args["victim"] != a.args["user"]


def test_a_long_run_meets_every_kind_and_every_request() -> None:
    actions = [a for s in (1, 2) for a in schedule(s, 900.0, 3, 8, 45.0)]
    assert {a.kind for a in actions} == set(KINDS)
    asked = {(a.args["verb"], a.args["how"]) for a in actions if a.kind == "cross_user"}
    assert asked == {(v, h) for v in VERBS for h in ("socket", "state_dir")}
    assert {a.args["gone_s"] for a in actions if a.kind == "kill_agent"} == {2.0, 45.0}


def test_main_jobs_never_overlap() -> None:
    for seed in range(1, 6):
        busy_until = 0.0
        for a in schedule(seed, 900.0, 2, 8, 45.0):
            if a.kind in ("main_job", "allocator_down"):
                assert a.at_s >= busy_until, a
                busy_until = a.at_s + a.args["length_s"] + a.args.get("down_s", 0.0)


def test_the_total_over_seeds_adds_every_figure_up() -> None:
    from tests.bftrainer.centre_soak import CentreReport

    a = CentreReport(seed=1, users=3, actions=5, violations=["x"], main_delays_s=[1.0])
    a.by_kind, a.refusals, a.wall_s = {"submit": 1}, {"by the allocator": 2}, 10.0
    b = CentreReport(seed=2, users=3, actions=7, main_delays_s=[2.0], wrong_uid=1)
    b.by_kind, b.refusals, b.wall_s = {"submit": 2, "kill_agent": 1}, {"by the allocator": 1}, 5.0
    total = CentreReport.total([a, b], users=3)
    assert isinstance(total, CentreReport) and (total.seed, total.users) == (-1, 3)
    assert (total.actions, total.violations, total.main_delays_s) == (12, ["x"], [1.0, 2.0])
    assert total.by_kind == {"submit": 3, "kill_agent": 1}
    assert total.refusals == {"by the allocator": 3}
    assert (total.wall_s, total.wrong_uid) == (15.0, 1)
    assert a.by_kind == {"submit": 1}, "the seeds' own reports are left as they were"
