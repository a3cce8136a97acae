"""Job logs that `trace from-log` and `trace stats` took or broke on: a field past csv's
limit, a last record cut mid-line, a node name that its own trace reader refuses, and
down lists or logs that grew the machine. Each is one line `FILE:LINE: ...`, exit 2,
nothing written (docs/traces.md, "Bad logs")."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from bftrainer.idle_monitor import joblog_model, trace_reader
from bftrainer.idle_monitor.joblog import JobLogError, pool_from_log
from tests.conftest import bftrainer
from tests.idle_monitor import joblog_writers as w

REPO = Path(__file__).resolve().parents[2]
MACHINE = 12


def refused(log: Path, message: str, *extra: str) -> None:
    """`from-log` and `stats` both refuse ``log`` in one line holding ``message``; an
    earlier ``--out`` is left as it was."""
    out = log.with_name("out.csv")
    out.write_text("an earlier trace\n")
    for command in (("from-log", str(log), "--out", str(out)), ("stats", str(log))):
        done = bftrainer("trace", *command, *extra)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
    assert out.read_text() == "an earlier trace\n"
    assert [p.name for p in log.parent.iterdir() if p.name.startswith(".")] == []


def _lsf(hosts: str, count: int = 2, tail: str = '64 60.0 "" "x" -1 -1 "" "default" 0 2') -> str:
    """One JOB_FINISH record of job 1, from 1700000000 to 1700000100."""
    return (
        '"JOB_FINISH" "10.1" 1700000103 1 1000 33554438 2 1699999990 0 1700000100 1700000000 '
        '"a" "b" "s" "" "" "l" "/h" "" "" "" "10/1.1" 1 "batch1" '
        f"{count} {hosts} {tail}"
    )


# D8: a field over csv's 128 KiB limit was a `_csv.Error` traceback.
def test_an_lsf_field_past_the_csv_limit_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "big.acct"
    log.write_text(_lsf('"' + "a" * 200_000 + '" "n4"') + "\n")
    refused(log, "big.acct:1: not a readable lsb.acct record: a field longer than 131,072")


# D9: a last record cut mid-line was read as whole.
CUT = {
    # `NodeList=n1` may be the start of n10: job 2 was put on n1.
    "jobcomp": (
        "jobcomp.log",
        "JobId=1 JobState=COMPLETED StartTime=2023-11-14T22:00:00 EndTime=2023-11-14T23:00:00 "
        "NodeList=n[1-3] NodeCnt=3\n"
        "JobId=2 JobState=COMPLETED StartTime=2023-11-14T22:10:00 EndTime=2023-11-14T22:50:00 "
        "NodeList=n1",
    ),
    # cut inside a quoted host: "1 jobs on 2 nodes" with a node named `n`.
    "lsf": ("lsb.acct", _lsf('"n4" "n', tail="")[:-1]),
    "sacct": ("sacct.txt", w.sacct(w.random_jobs(1, MACHINE, 5))[:-1]),
    "pbs": ("acct.log", w.pbs(w.random_jobs(1, MACHINE, 5))[:-1]),
    "swf": ("log.swf", w.swf(w.random_jobs(1, MACHINE, 5), MACHINE)[:-1]),
}


@pytest.mark.parametrize("fmt", sorted(CUT))
def test_a_last_line_without_its_newline_is_a_cut_record(fmt: str, tmp_path: Path) -> None:
    name, text = CUT[fmt]
    last = text.count("\n") + 1
    log = tmp_path / name
    log.write_text(text)
    refused(log, f"{name}:{last}: the last line ends without a newline")
    zipped = tmp_path / f"{name}.gz"  # the same inside gzip
    zipped.write_bytes(gzip.compress(text.encode()))
    refused(zipped, f"{name}.gz:{last}: the last line ends without a newline")


def test_hand_written_lists_may_lack_the_last_newline(tmp_path: Path) -> None:
    """The rule is the log's (every scheduler ends its lines); a node list or down list
    written by hand without a last newline is read as it was."""
    jobs = w.random_jobs(2, MACHINE, 10)
    log = tmp_path / "sacct.txt"
    log.write_text(w.sacct(jobs)[:-1])
    nodes = tmp_path / "nodes.txt"
    nodes.write_text(f"n[0-{MACHINE - 1}]")
    down = tmp_path / "down.txt"
    down.write_text(f"{jobs[0].start_s:.0f},{jobs[0].end_s:.0f},n0")
    lists = ("--node-list", str(nodes), "--down", str(down))
    last = w.sacct(jobs).count("\n")
    refused(log, f"sacct.txt:{last}: the last line ends without a newline", *lists)
    log.write_text(w.sacct(jobs))
    done = bftrainer("trace", "from-log", str(log), "--out", str(tmp_path / "t.csv"), *lists)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("case", "hosts", "count", "message"),
    [
        # `"n4 64 60.0 " x` was a node.
        ("unclosed quote", '"n4" "n4', 2, "lsb.acct:1: not a readable lsb.acct record"),
        # numExHosts 3 over 2 hosts: exitStatus `64` was a node.
        ("count past the hosts", '"n4" "n5"', 3, "lsb.acct:1: job 1: its 3 execution hosts"),
        # numExHosts 1 under 2 hosts: the second host was read as exitStatus.
        ("count short of the hosts", '"n4" "n5"', 1, "numExHosts does not count the hosts"),
    ],
)
def test_lsf_fields_after_the_hosts_are_checked(
    case: str, hosts: str, count: int, message: str, tmp_path: Path
) -> None:
    log = tmp_path / "lsb.acct"
    log.write_text(_lsf(hosts, count) + "\n")
    refused(log, message)


# D10: from-log wrote node names that its own reader refuses.
def test_the_trace_reader_and_the_job_logs_share_one_name_check() -> None:
    assert joblog_model.node_name_problem is trace_reader.node_name_problem


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "sacct.txt",
            "JobID|Start|End|NNodes|NodeList\n1|1700000000|1700000100|1|n\x011\n",
            "sacct.txt:2: job 1: node 'n\\x011' is not a printable name",
        ),
        (
            "jobcomp.log",
            "JobId=1 StartTime=1700000000 EndTime=1700000100 NodeList=n\x7f1 NodeCnt=1\n",
            "jobcomp.log:1: job 1: node 'n\\x7f1' is not a printable name",
        ),
        ("lsb.acct", _lsf('"n\x004" "n4"') + "\n", "lsb.acct:1: job 1: node 'n\\x004' is not a"),
        # the trace is written unquoted: `a,b` made the row `time,a,b,0`.
        ("lsb.acct", _lsf('"a,b" "n4"') + "\n", "lsb.acct:1: job 1: node 'a,b' holds a ','"),
        ("lsb.acct", _lsf('" n4" "n5"') + "\n", "lsb.acct:1: job 1: node ' n4' holds"),
    ],
    ids=["sacct control", "jobcomp DEL", "lsf NUL", "lsf comma", "lsf blank"],
)
def test_a_node_name_a_trace_cannot_hold_is_refused(
    name: str, content: str, message: str, tmp_path: Path
) -> None:
    log = tmp_path / name
    log.write_text(content)
    refused(log, message)


def test_a_node_list_name_a_trace_cannot_hold_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "sacct.txt"
    log.write_text("JobID|Start|End|NNodes|NodeList\n1|1700000000|1700000100|1|n1\n")
    nodes = tmp_path / "nodes.txt"
    nodes.write_text("n1\nn\x012\n")
    refused(log, f"{nodes}:2: node 'n\\x012' is not a printable name", "--node-list", str(nodes))


# D11: a down list or a log that grew the machine.
_SACCT6 = "JobID|Start|End|NNodes|NodeList\n1|1700000000|1700000200|6|n[1-6]\n"


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ("-3", "down.txt:1: down node count '-3' is not a whole number"),
        ("1e3", "down.txt:1: down node count '1e3' is not a whole number"),
        ("zz9", "down.txt:1: down node 'zz9' is not in the machine: no job in the log ran"),
        ("n[5-7]", "down.txt:1: down node 'n7' is not in the machine"),
        ("7", "down.txt:1: 7 down nodes, more than the machine's 6"),
    ],
)
def test_a_down_list_never_grows_the_machine(nodes: str, message: str, tmp_path: Path) -> None:
    log = tmp_path / "sacct.txt"
    log.write_text(_SACCT6)
    down = tmp_path / "down.txt"
    down.write_text(f"1700000000,1700000100,{nodes}\n")
    refused(log, message, "--down", str(down))


def test_a_down_node_outside_the_node_list_is_refused_and_inside_it_taken(tmp_path: Path) -> None:
    log = tmp_path / "sacct.txt"
    log.write_text(_SACCT6)
    node_list = tmp_path / "nodes.txt"
    node_list.write_text("n[1-6]\nzz9\n")
    down = tmp_path / "down.txt"
    down.write_text("1700000000,1700000100,zz[8-9]\n")
    lists = ("--node-list", str(node_list), "--down", str(down))
    refused(log, f"down.txt:1: down node 'zz8' is not in the node list {node_list}", *lists)
    down.write_text("1700000000,1700000100,zz9\n")
    pool = pool_from_log(log, node_list=node_list, down=down)
    assert pool.pool.machine.names == ("n1", "n2", "n3", "n4", "n5", "n6", "zz9")


def test_a_log_naming_more_nodes_than_a_machine_has_is_refused(tmp_path: Path) -> None:
    """One PBS record of 1,000,001 hosts: "1 jobs on 1,000,001 nodes" was written, while
    --nodes and --node-list refuse more than 1,000,000."""
    hosts = "+".join(f"h{i}/0" for i in range(1_000_001))
    log = tmp_path / "acct.log"
    log.write_text(
        f"11/14/2023 22:13:21;E;1.pbs01;start=1700000000 end=1700000100 exec_host={hosts}\n"
    )
    with pytest.raises(JobLogError) as caught:
        pool_from_log(log)
    assert str(caught.value).startswith(
        f"{log}:1: job 1.pbs01: the log names more than 1,000,000 nodes by this record"
    )
