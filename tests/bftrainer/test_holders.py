"""Holders without a cluster: windows, command lines, parsers, and the reconcile logic,
for Slurm (lines captured from the local Slurm 22.05.8) and LSF (replies written from
IBM's documentation, tests/bftrainer/holders_fixtures/). The live Slurm tests are in
test_holders_slurm.py."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from bftrainer.holders import (
    HolderStatus,
    HolderStatusError,
    HolderSubmitError,
    LsfHolders,
    SlurmHolders,
    WindowTooShortError,
    lsf_step_argv,
    slurm_step_argv,
    window_minutes,
)
from bftrainer.holders.lsf import parse_bjobs_holders
from bftrainer.holders.slurm import (
    parse_duration_min,
    parse_partition_max_minutes,
    parse_squeue_holders,
)
from bftrainer.idle_monitor.runner import (
    CommandError,
    CommandResult,
    CommandTimeoutError,
    ReplayRunner,
    recorded,
)

FIXTURES = Path(__file__).resolve().parent / "holders_fixtures"

# `scontrol show partition bf -o` of the local cluster (shortened).
PARTITION_BF = (
    "PartitionName=bf AllowGroups=ALL Default=NO DefaultTime=NONE GraceTime=30 "
    "MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 Nodes=node[1-8] PriorityTier=1 "
    "PreemptMode=REQUEUE State=UP TotalNodes=8\n"
)
# `squeue --me -h -t all -p bf -n bftrainer-hold -O 'JobID:|,State:|,ReqNodes:|,
# NodeList:|,PreemptTime:|,Reason:|'` with SLURM_TIME_FORMAT=%s, captured on the local
# cluster: a running holder, one preempted (COMPLETED with PreemptTime), one preempted
# while still running its grace, a pending one, a cancelled one, a suspended one.
SQUEUE = """\
11|RUNNING|node1|node1|N/A|None|
12|COMPLETED|node2|node2|1795375794|None|
13|RUNNING|node3|node3|1795375800|None|
14|PENDING|node4||N/A|Resources|
15|CANCELLED|node5|node5|N/A|None|
16|SUSPENDED|node6|node6|N/A|None|
"""


def slurm(**replies: Sequence[CommandResult | CommandError]) -> tuple[SlurmHolders, ReplayRunner]:
    runner = ReplayRunner({"scontrol": [recorded(PARTITION_BF)], **replies})
    return SlurmHolders(runner, script="/opt/bftrainer/hold-nodes.sbatch"), runner


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# ---------------------------------------------------------------------- windows


def test_window_is_rounded_down_and_capped() -> None:
    assert window_minutes(179.9, None) == 2
    assert window_minutes(60.0, None) == 1
    assert window_minutes(7200.0, 90) == 90
    assert window_minutes(None, 90) == 90
    assert window_minutes(None, None) is None
    assert window_minutes(float("inf"), 30) == 30
    # Under a minute no holder fits; Slurm would read --time=0 as no limit at all.
    with pytest.raises(WindowTooShortError, match=r"window of 59\.9 s is under 60 s"):
        window_minutes(59.9, None)
    with pytest.raises(WindowTooShortError):
        window_minutes(float("nan"), None)


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("UNLIMITED", None),
        ("INFINITE", None),
        ("30", 30),
        ("30:59", 30),
        ("1:30:00", 90),
        ("2-00:00:00", 2880),
        ("2-12", 3600),
        ("1-00:30", 1470),
    ],
)
def test_slurm_durations(text: str, minutes: int | None) -> None:
    assert parse_duration_min(text) == minutes


def test_partition_max_time() -> None:
    assert parse_partition_max_minutes(PARTITION_BF) is None
    assert parse_partition_max_minutes(PARTITION_BF.replace("UNLIMITED M", "1-00:00:00 M")) == (
        1440
    )
    with pytest.raises(ValueError, match="no MaxTime="):
        parse_partition_max_minutes("PartitionName=bf State=UP")


# ---------------------------------------------------------------------- Slurm


def test_slurm_acquire_submits_one_node_limited_to_its_window() -> None:
    holders, runner = slurm(sbatch=[recorded("4242\n")])
    # 210 s less a minute of slack (Slurm's backfill resolution), rounded down: 2 minutes.
    assert holders.acquire("node3", 210.0) == "4242"
    assert runner.calls[-1][0] == (
        "sbatch",
        "--parsable",
        "--partition=bf",
        "--nodelist=node3",
        "--nodes=1",
        "--job-name=bftrainer-hold",
        "--time=2",
        "/opt/bftrainer/hold-nodes.sbatch",
    )
    assert holders.acquire("node4", None) == "4242"
    assert "--time=UNLIMITED" in runner.calls[-1][0]  # the partition's MaxTime


def test_slurm_acquire_caps_at_partition_max_time_read_once() -> None:
    capped = PARTITION_BF.replace("MaxTime=UNLIMITED", "MaxTime=04:00:00")
    runner = ReplayRunner({"scontrol": [recorded(capped)], "sbatch": [recorded("7;cluster\n")]})
    holders = SlurmHolders(runner, partition="bf", extra_args=["--qos=bftrainer"])
    assert holders.acquire("node1", None) == "7"
    assert holders.acquire("node2", 10 * 3600.0) == "7"
    sbatch_calls = [argv for argv, _ in runner.calls if argv[0] == "sbatch"]
    assert [a[6] for a in sbatch_calls] == ["--time=240", "--time=240"]
    assert all(a[7] == "--qos=bftrainer" for a in sbatch_calls)
    assert [argv[0] for argv, _ in runner.calls].count("scontrol") == 1


def test_slurm_acquire_errors_name_the_node() -> None:
    holders, _ = slurm(
        sbatch=[recorded(stderr="sbatch: error: Invalid node name specified", returncode=1)]
    )
    with pytest.raises(HolderSubmitError, match=r"holder for node9 not submitted.*Invalid node"):
        holders.acquire("node9", None)
    holders, _ = slurm(sbatch=[recorded("Submitted batch job 12\n")])
    with pytest.raises(HolderSubmitError, match="holder for node1: no job id"):
        holders.acquire("node1", None)
    holders, runner = slurm(sbatch=[recorded("1\n")])
    for window in (30.0, 119.0):  # under a minute once the slack is taken
        with pytest.raises(WindowTooShortError):
            holders.acquire("node1", window)
    assert not [c for c in runner.calls if c[0][0] == "sbatch"]


def test_the_slack_before_a_window_ends_is_a_setting() -> None:
    runner = ReplayRunner({"scontrol": [recorded(PARTITION_BF)]})
    assert SlurmHolders(runner).time_limit_min(150.0) == 1
    assert SlurmHolders(runner, slack_s=0.0).time_limit_min(150.0) == 2
    assert SlurmHolders(runner, slack_s=300.0).time_limit_min(400.0) is not None
    with pytest.raises(WindowTooShortError):
        SlurmHolders(runner, slack_s=300.0).time_limit_min(350.0)
    with pytest.raises(ValueError, match="holder slack"):
        SlurmHolders(runner, slack_s=-1.0)


def test_squeue_holders_parse() -> None:
    held = parse_squeue_holders(SQUEUE)
    assert held["11"] == HolderStatus("node1", "running", "", "RUNNING")
    assert held["12"] == HolderStatus("node2", "ended", "preempted", "COMPLETED")
    # Preempted while still in its grace time: the node is not ours any more.
    assert held["13"] == HolderStatus("node3", "ended", "preempted", "RUNNING")
    assert held["14"] == HolderStatus("node4", "pending", "Resources", "PENDING")
    assert held["15"] == HolderStatus("node5", "ended", "cancelled", "CANCELLED")
    assert held["16"] == HolderStatus("node6", "ended", "suspended", "SUSPENDED", True)
    assert parse_squeue_holders("") == {}
    with pytest.raises(ValueError, match="line 1: expected JobID"):
        parse_squeue_holders("11|RUNNING|node1\n")


def test_slurm_held_is_one_batched_call() -> None:
    holders, runner = slurm(squeue=[recorded(SQUEUE)])
    assert set(holders.held()) == {"11", "12", "13", "14", "15", "16"}
    (argv, env), *_ = [c for c in runner.calls if c[0][0] == "squeue"]
    assert argv == (
        "squeue",
        "--me",
        "--noheader",
        "--states=all",
        "--partition=bf",
        "--name=bftrainer-hold",
        "--Format=JobID:|,State:|,ReqNodes:|,NodeList:|,PreemptTime:|,Reason:|",
    )
    assert env == {"SLURM_TIME_FORMAT": "%s"}
    assert len(runner.calls) == 1


def test_slurm_held_failures_are_holder_status_errors() -> None:
    down = "squeue: error: Unable to contact slurm controller (connect failure)"
    holders, _ = slurm(squeue=[recorded(stderr=down, returncode=1)])
    with pytest.raises(HolderStatusError, match="Unable to contact slurm controller"):
        holders.held()
    holders, _ = slurm(squeue=[CommandTimeoutError(["squeue"], "replay", 20)])
    with pytest.raises(HolderStatusError, match="timed out"):
        holders.held()
    holders, _ = slurm(squeue=[recorded("garbage\n")])
    with pytest.raises(HolderStatusError, match="unusable reply"):
        holders.held()


def test_slurm_reconcile() -> None:
    holders, runner = slurm(squeue=[recorded(SQUEUE)], scancel=[recorded()])
    # The state knows 11 (running), 12 (preempted), 14 (pending), 16 (suspended) and
    # 99 (ended long ago: no longer listed); 13 and 15 it does not know.
    result = holders.reconcile({"11": "node1", "12": "node2", "14": "node4", "16": "node6",
                                "99": "node7"})  # fmt: skip
    assert set(result.live) == {"11", "14"}
    assert set(result.gone) == {"12", "16", "99"}
    assert result.gone["99"] == HolderStatus("node7", "ended", "not listed")
    assert result.gone["12"].reason == "preempted"
    # 13 is unknown but already preempted (ending): left alone. 15 ended. 16 lingers.
    assert set(result.cancelled) == {"16"}
    assert [argv for argv, _ in runner.calls if argv[0] == "scancel"] == [("scancel", "16")]


def test_slurm_reconcile_cancels_unknown_live_holders_in_one_call() -> None:
    holders, runner = slurm(squeue=[recorded(SQUEUE)], scancel=[recorded()])
    result = holders.reconcile(set())
    assert set(result.cancelled) == {"11", "14", "16"}
    assert result.live == {} and result.gone == {}
    assert [argv for argv, _ in runner.calls if argv[0] == "scancel"] == [
        ("scancel", "11", "14", "16")
    ]


def test_slurm_release() -> None:
    holders, runner = slurm(scancel=[recorded()])
    holders.release("5", "3", "5")
    holders.release()
    assert [argv for argv, _ in runner.calls] == [("scancel", "3", "5")]


def test_slurm_release_of_many_holders_is_split_over_parallel_scancels() -> None:
    holders, runner = slurm(scancel=[recorded()])
    ids = [str(i) for i in range(100, 160)]
    holders.release(*ids)
    calls = [argv[1:] for argv, _ in runner.calls if argv[0] == "scancel"]
    assert len(calls) == 3 and all(len(c) <= 25 for c in calls)
    assert sorted(i for c in calls for i in c) == ids


def test_step_argv() -> None:
    assert slurm_step_argv("4242", "node3", ["python", "w.py"]) == [
        "srun", "--jobid=4242", "--overlap", "-N1", "-n1", "-w", "node3", "python", "w.py",
    ]  # fmt: skip
    assert lsf_step_argv("3101", "a01n02", ["python", "w.py"]) == [
        "env", "LSB_JOBID=3101", "blaunch", "-z", "a01n02", "python", "w.py",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="no command"):
        slurm_step_argv("1", "node1", [])


def test_job_name_must_be_one_word() -> None:
    with pytest.raises(ValueError, match="holder job name holds"):
        SlurmHolders(ReplayRunner({}), job_name="two words")


# ---------------------------------------------------------------------- LSF


def lsf(**replies: Sequence[CommandResult | CommandError]) -> tuple[LsfHolders, ReplayRunner]:
    runner = ReplayRunner(replies)
    return LsfHolders(runner, queue="killable", script="/gpfs/bftrainer/bsub-hold.lsf"), runner


def test_lsf_acquire() -> None:
    holders, runner = lsf(bsub=[recorded(fixture("lsf-bsub.txt"))])
    assert holders.acquire("a01n02", 3659.0) == "3101"  # less the slack: 59 minutes
    assert runner.calls[-1][0] == (
        "bsub", "-q", "killable", "-m", "a01n02", "-n", "1", "-x",
        "-J", "bftrainer-hold-a01n02", "-o", "/dev/null", "-e", "/dev/null",
        "-W", "59", "/gpfs/bftrainer/bsub-hold.lsf",
    )  # fmt: skip
    holders.acquire("a01n03", None)
    assert "-W" not in runner.calls[-1][0]  # the queue's RUNLIMIT applies
    holders, _ = lsf(bsub=[recorded(stderr=fixture("lsf-bsub-refused.stderr"), returncode=255)])
    with pytest.raises(HolderSubmitError, match=r"a01n99.*User cannot use the queue"):
        holders.acquire("a01n99", None)


def test_lsf_bjobs_holders_parse() -> None:
    held = parse_bjobs_holders(fixture("lsf-bjobs-holders.json"), "killable", "bftrainer-hold")
    assert held == {
        "3101": HolderStatus("a01n02", "running", "", "RUN"),
        "3102": HolderStatus("a01n03", "pending", "pend", "PEND"),
        "3103": HolderStatus("a01n04", "ended", "exit", "EXIT"),
        "3104": HolderStatus("a01n05", "ended", "suspended", "SSUSP", True),
        "3107": HolderStatus("a01n07", "running", "", "RUN"),
    }  # 3105 (another job) and 3106 (another instance's holder) are not ours
    with pytest.raises(ValueError, match="not JSON"):
        parse_bjobs_holders(fixture("lsf-bjobs-holders.json")[:300], "killable", "x")


def test_lsf_held_and_reconcile() -> None:
    holders, runner = lsf(
        bjobs=[recorded(fixture("lsf-bjobs-holders.json"))],
        bkill=[recorded(stderr=fixture("lsf-bkill-finished.stderr"), returncode=255)],
    )
    result = holders.reconcile({"3101", "3102", "3103", "3104"})
    assert set(result.live) == {"3101", "3102"}
    assert set(result.gone) == {"3103", "3104"}
    assert set(result.cancelled) == {"3104", "3107"}  # suspended; unknown
    assert [argv for argv, _ in runner.calls] == [
        ("bjobs", "-a", "-q", "killable", "-o", "jobid stat queue exec_host job_name", "-json"),
        ("bkill", "3104", "3107"),
    ]


@pytest.mark.parametrize("returncode", [0, 255])
def test_lsf_no_job_found_is_no_holder(returncode: int) -> None:
    none = fixture("lsf-bjobs-none.stderr")
    holders, _ = lsf(bjobs=[recorded(stderr=none, returncode=returncode)])
    assert holders.held() == {}
    holders, _ = lsf(bjobs=[recorded(stdout=none, returncode=returncode)])
    result = holders.reconcile({"3101"})
    assert result.gone == {"3101": HolderStatus("", "ended", "not listed")}


def test_lsf_bjobs_failure_is_a_status_error() -> None:
    holders, _ = lsf(bjobs=[recorded(stderr="killable: No such queue", returncode=255)])
    with pytest.raises(HolderStatusError, match="No such queue"):
        holders.held()
