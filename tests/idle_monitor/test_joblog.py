"""Job logs in, pool traces out (`bftrainer trace from-log`, `replay LOG`, `trace stats
LOG`): every format rebuilds the idle pool that an independent computation gives, in any
record order; repeats, over-commitment and bad logs are handled as docs/traces.md says."""

from __future__ import annotations

import dataclasses
import gzip
import json
import random
from pathlib import Path

import pytest

from bftrainer.idle_monitor.trace import Trace, load_trace
from tests.conftest import bftrainer
from tests.idle_monitor import joblog_writers as w

REPO = Path(__file__).resolve().parents[2]
MACHINE = 12


def convert(log: Path, out: Path, *extra: str) -> Trace:
    done = bftrainer("trace", "from-log", str(log), "--out", str(out), *extra)
    assert done.returncode == 0, done.stderr
    return load_trace(out)


def idle_at(trace: Trace, t: float) -> frozenset[str]:
    """The trace's pool at ``t``: its snapshot and every event up to ``t``."""
    idle = set(trace.initial_idle)
    for e in trace.events:
        if e.time_s > t:
            break
        idle |= e.joined
        idle -= e.left
    return frozenset(idle)


def probes(jobs: list[w.Job]) -> list[float]:
    marks = sorted({t for j in jobs for t in (j.start_s, j.end_s)})
    return [t + d for t in marks[:-1] for d in (0.0, 0.5)]


def held_at(jobs: list[w.Job], t: float) -> list[w.Job]:
    return [j for j in jobs if j.start_s <= t < j.end_s]


NAMED = {
    "sacct": ("log.txt", w.sacct),
    "jobcomp": ("jobcomp.log", w.jobcomp),
    "lsf": ("lsb.acct", w.lsb_acct),
    "pbs": ("20240101", w.pbs),
}


@pytest.mark.parametrize("fmt", sorted(NAMED))
def test_named_nodes_rebuild_each_node_exactly(fmt: str, tmp_path: Path) -> None:
    jobs = w.random_jobs(seed=len(fmt), machine=MACHINE, count=60)
    name, write = NAMED[fmt]
    log = tmp_path / name
    log.write_text(write(jobs))
    nodes = tmp_path / "nodes.txt"
    nodes.write_text(f"n[0-{MACHINE - 1}]\n")
    trace = convert(log, tmp_path / "t.csv.gz", "--node-list", str(nodes))
    everyone = frozenset(f"n{i}" for i in range(MACHINE))
    assert set(trace.nodes) == everyone
    for t in probes(jobs):
        if t < trace.start_s:
            continue
        busy = {n for j in held_at(jobs, t) for n in j.nodes}
        assert idle_at(trace, t) == everyone - busy, f"{fmt} at {t - w.T0}"


@pytest.mark.parametrize("fmt", ["swf", "cobalt"])
def test_counts_only_give_the_exact_idle_count(fmt: str, tmp_path: Path) -> None:
    jobs = w.random_jobs(seed=7, machine=MACHINE, count=80)
    log = tmp_path / ("theta.swf" if fmt == "swf" else "cobalt.log")
    log.write_text(w.swf(jobs, MACHINE) if fmt == "swf" else w.pbs(jobs, cobalt=True))
    extra = () if fmt == "swf" else ("--nodes", str(MACHINE))  # SWF's header says MaxNodes
    trace = convert(log, tmp_path / "t.csv", *extra)
    assert len(trace.nodes) == MACHINE
    for t in probes(jobs):
        if t >= trace.start_s:
            want = max(0, MACHINE - sum(len(j.nodes) for j in held_at(jobs, t)))
            assert len(idle_at(trace, t)) == want, f"{fmt} at {t - w.T0}"


def test_records_in_any_order_give_the_same_trace(tmp_path: Path) -> None:
    jobs = w.random_jobs(seed=3, machine=MACHINE, count=50)
    text = w.swf(jobs, MACHINE).splitlines()
    header = [line for line in text if line.startswith(";")]
    body = [line for line in text if not line.startswith(";")]
    random.Random(1).shuffle(body)
    (tmp_path / "a.swf").write_text("\n".join(text) + "\n")
    (tmp_path / "b.swf").write_text("\n".join(header + body) + "\n")
    a = convert(tmp_path / "a.swf", tmp_path / "a.csv")
    b = convert(tmp_path / "b.swf", tmp_path / "b.csv")
    assert (a.initial_idle, a.events) == (b.initial_idle, b.events)


def test_repeats_count_once_and_strict_names_them(tmp_path: Path) -> None:
    jobs = w.random_jobs(seed=5, machine=MACHINE, count=30)
    lines = w.sacct(jobs).splitlines()
    log = tmp_path / "sacct.txt"
    log.write_text("\n".join([*lines, lines[1].replace(f"{jobs[0].job_id}|", "999|", 1)]) + "\n")
    (tmp_path / "once.txt").write_text("\n".join(lines) + "\n")
    done = bftrainer("trace", "from-log", str(log), "--out", str(tmp_path / "t.csv"))
    assert done.returncode == 0, done.stderr
    assert "1 records repeated another's" in done.stdout
    once = convert(tmp_path / "once.txt", tmp_path / "once.csv")
    twice = load_trace(tmp_path / "t.csv")
    assert (once.initial_idle, once.events) == (twice.initial_idle, twice.events)
    strict = bftrainer("trace", "from-log", str(log), "--strict", "--out", str(tmp_path / "s.csv"))
    assert strict.returncode == 2
    assert f"{log}:{len(lines) + 1}: job 999 repeats job {jobs[0].job_id}" in strict.stderr
    assert not (tmp_path / "s.csv").exists()


def test_overcommitted_counts_and_strict(tmp_path: Path) -> None:
    jobs = w.random_jobs(seed=11, machine=MACHINE, count=60, overcommit=True)
    log = tmp_path / "over.swf"
    log.write_text(w.swf(jobs, MACHINE))
    # A record with another's start, end and size is a repeat (docs/traces.md).
    jobs = list({(j.start_s, j.end_s, len(j.nodes)): j for j in reversed(jobs)}.values())
    done = bftrainer("trace", "from-log", str(log), "--out", str(tmp_path / "t.csv"))
    assert done.returncode == 0, done.stderr
    trace = load_trace(tmp_path / "t.csv")
    over = 0
    for t in probes(jobs):
        if t >= trace.start_s:
            held = sum(len(j.nodes) for j in held_at(jobs, t))
            over = max(over, held - MACHINE)
            assert len(idle_at(trace, t)) == max(0, MACHINE - held)
    assert over > 0, "the generated log must over-commit the machine"
    assert f"(peak {over} nodes over)" in done.stdout
    once = tmp_path / "once.swf"
    once.write_text(w.swf(jobs, MACHINE))
    strict = bftrainer("trace", "from-log", str(once), "--strict", "--out", str(tmp_path / "s.csv"))
    assert strict.returncode == 2 and "over-commits the machine" in strict.stderr
    assert strict.stderr.count("\n") == 1 and not (tmp_path / "s.csv").exists()


def test_windows_state_the_plan_and_idle_s_the_fact(tmp_path: Path) -> None:
    """A on n0,n1 (limit 200 s) and C on n2 (ends at 20 s) run; B needs all 4 nodes from
    10 s. When n2 frees at 20 s, EASY backfill's plan starts B when A's limit ends, at
    200 s: n2's window is 180 s. B did start at 100 s (A ended early): idle_s is 80 s."""
    log = tmp_path / "sacct.txt"
    t, iso = w.T0, w._iso
    log.write_text(
        "JobID|Submit|Start|End|NNodes|NodeList|Timelimit\n"
        f"A|{iso(t - 5)}|{iso(t)}|{iso(t + 100)}|2|n[0-1]|00:03:20\n"
        f"C|{iso(t - 5)}|{iso(t)}|{iso(t + 20)}|1|n2|00:00:30\n"
        f"B|{iso(t + 10)}|{iso(t + 100)}|{iso(t + 150)}|4|n[0-3]|00:05:00\n"
    )
    out = tmp_path / "t.csv"
    done = bftrainer("trace", "from-log", str(log), "--nodes", "4", "--out", str(out))
    assert done.returncode == 0, done.stderr
    header, *lines = out.read_text().splitlines()
    assert header == "time,node,idle,window_s,idle_s"
    (join,) = [r for r in lines if r.split(",")[1] == "n2" and r.split(",")[2] == "1"]
    assert join.split(",")[3:] == ["180", "80"]
    # n3 was never used: idle from the start until B took it at 100 s, no plan then.
    (first,) = [r for r in lines if r.split(",")[1] == "n3" and r.split(",")[2] == "1"]
    assert first.split(",")[4] == "100"


def test_down_intervals_are_not_idle(tmp_path: Path) -> None:
    jobs = w.random_jobs(seed=2, machine=MACHINE, count=20)
    log = tmp_path / "sacct.txt"
    log.write_text(w.sacct(jobs))
    nodes = tmp_path / "nodes.txt"
    nodes.write_text(f"n[0-{MACHINE - 1}]\n")
    down = tmp_path / "down.csv"
    a, b = w.T0 + 10, w.T0 + 4000
    down.write_text(f"# maintenance\n{a:.0f},{b:.0f},n[0-2]\n")
    trace = convert(log, tmp_path / "t.csv", "--node-list", str(nodes), "--down", str(down))
    for t in probes(jobs):
        if t >= trace.start_s:
            idle = idle_at(trace, t)
            assert not ({"n0", "n1", "n2"} & idle) or not a <= t < b
            busy = {n for j in held_at(jobs, t) for n in j.nodes}
            assert not (idle & busy)


BAD = {
    "truncated gzip": (
        "log.swf.gz",
        lambda: gzip.compress(w.swf(w.random_jobs(1, MACHINE, 40), MACHINE).encode())[:-30],
        "cut or damaged",
    ),
    "end before start": (
        "sacct.txt",
        lambda: (
            b"JobID|Start|End|NNodes|NodeList\n1|2024-01-01T01:00:00|2024-01-01T00:00:00|1|n1\n"
        ),
        "sacct.txt:2: job 1 ends",
    ),
    "implausible time": (
        "sacct.txt",
        lambda: b"JobID|Start|End|NNodes|NodeList\n1|1700000000000|1700000001000|1|n1\n",
        "sacct.txt:2: job 1 start: time '1700000000000' is outside",
    ),
    "bad hostlist": (
        "sacct.txt",
        lambda: b"JobID|Start|End|NNodes|NodeList\n1|1700000000|1700000100|2|n[1-\n",
        "sacct.txt:2: job 1: unclosed '['",
    ),
    "unknown format": ("log.txt", lambda: b"hello\nworld\n", "unknown job-log format"),
    "no usable job": (
        "sacct.txt",
        lambda: b"JobID|Start|End|NNodes|NodeList\n1|Unknown|Unknown|0|None assigned\n",
        "no usable job in this sacct log (skipped: 1 never started)",
    ),
    "cut line": (
        "log.swf",
        lambda: b"; MaxNodes: 4\n1 0 0 10 2 -1 -1 2 60 -1 1 -1 -1 -1 -1 -1 -1 0\n2 5 0 10",
        "log.swf:3: the last line ends without a newline",
    ),
    "node outside the node list": (
        "sacct.txt",
        lambda: b"JobID|Start|End|NNodes|NodeList\n1|1700000000|1700000100|1|zz9\n",
        "sacct.txt:2: job 1 ran on 'zz9', which is not in the machine's node list",
    ),
    "repeated column": (
        "sacct.txt",
        lambda: b"JobID|Start|End|NNodes|NodeList|NodeList\n1|1700000000|1700000100|1|n1|n2\n",
        "sacct.txt:1: column 'NodeList' appears more than once in the header",
    ),
    # A text stream fails a whole chunk (8 KiB) at once: the line is found again in bytes.
    "not UTF-8, thousands of lines in": (
        "log.swf",
        lambda: _swf_with_a_bad_byte_at(3001),
        "log.swf:3001: not text (bytes that are not UTF-8)",
    ),
    "not UTF-8 in a gzip log": (
        "log.swf.gz",
        lambda: gzip.compress(_swf_with_a_bad_byte_at(3001)),
        "log.swf.gz:3001: not text (bytes that are not UTF-8)",
    ),
    "no size": (
        "cobalt.log",
        lambda: w.pbs(w.random_jobs(1, 4, 3), cobalt=True).encode(),
        "--nodes N",
    ),
}


def _swf_with_a_bad_byte_at(line: int) -> bytes:
    """An SWF log of 5,000 lines (250 kB) whose line ``line`` holds a byte that is not UTF-8."""
    lines = [b"; MaxNodes: 4\n"]
    lines += [b"%d 0 0 10 2 -1 -1 2 60 -1 1 -1 -1 -1 -1 -1 -1 0\n" % i for i in range(1, 5000)]
    lines[line - 1] = lines[line - 1].replace(b" 10 ", b" 1\xe90 ", 1)
    return b"".join(lines)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_logs_get_one_line_and_nothing_written(case: str, tmp_path: Path) -> None:
    name, content, message = BAD[case]
    log = tmp_path / name
    log.write_bytes(content())
    nodes = tmp_path / "nodes.txt"
    nodes.write_text("n[0-11]\n")
    out = tmp_path / "out.csv"
    out.write_text("an earlier trace\n")
    extra = ("--node-list", str(nodes)) if case == "node outside the node list" else ()
    done = bftrainer("trace", "from-log", str(log), "--out", str(out), *extra)
    assert done.returncode == 2, done.stdout
    assert message in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert out.read_text() == "an earlier trace\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_stats_and_replay_read_a_job_log(tmp_path: Path) -> None:
    jobs = w.random_jobs(seed=9, machine=MACHINE, count=40)
    log = tmp_path / "theta.swf"
    log.write_text(w.swf(jobs, MACHINE))
    stats = bftrainer("trace", "stats", str(log), "--json")
    assert stats.returncode == 0, stats.stderr
    figures = json.loads(stats.stdout)
    assert figures["nodes"] == MACHINE and "possible_outages" in figures
    assert f"swf, {len(jobs)} jobs on 12 nodes" in stats.stderr
    job_set = tmp_path / "S-Jbnd-2J.csv"
    job_set.write_text(
        "job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub\n"
        "a,10,10,1,4,1e6,2021-02-10 00:00:00\nb,10,10,1,4,1e6,2021-02-10 00:10:00\n"
    )
    (tmp_path / "S-JNPs-2J.csv").write_text(
        "job,nodes,throughput_samples_per_s\na,1,10\na,4,38\nb,1,10\nb,4,38\n"
    )
    out = tmp_path / "replay"
    done = bftrainer(
        "replay", str(log), "--jobs", str(job_set), "--shift-arrivals", "start",
        "--policy", "equal", "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    trace_start = min(j.start_s for j in jobs)
    assert summary["arrival_shift_s"] == pytest.approx(trace_start - 1612915200.0)
    assert summary["windows"] == "trace"  # a job log's planned windows, by default
    refused = bftrainer("replay", str(log), "--jobs", str(job_set), "--out", str(tmp_path / "x"))
    assert refused.returncode == 2 and "before" in refused.stderr


@pytest.mark.parametrize("fmt", ["sacct", "swf"])
def test_a_range_of_the_log_is_the_slice_of_its_whole_trace(fmt: str, tmp_path: Path) -> None:
    """A replay of a week reads only the week's events (``PoolFlips.trace(start, end)``):
    the same snapshot, windows (values and order) and events as slicing the whole
    trace, at every instant of the log and between them."""
    from bftrainer.idle_monitor.joblog import pool_from_log

    jobs = w.random_jobs(5, MACHINE, 80, overcommit=True)  # some with a plan's window
    log = tmp_path / ("log.txt" if fmt == "sacct" else "log.swf")
    log.write_text(w.sacct(jobs) if fmt == "sacct" else w.swf(jobs, MACHINE))
    pool = pool_from_log(log, nodes=MACHINE if fmt == "sacct" else None).pool
    whole = pool.trace()
    times = [f.time_s for f in pool.flips]
    ranges = [(t + d, t + d + h) for t in times for d in (0.0, 0.5) for h in (60.0, 1e9)]
    carried = 0
    for lo, hi in [(None, None), (None, times[3]), (times[2], None), *ranges]:
        if lo is not None and lo > pool.end_s:
            continue
        got, want = pool.trace(lo, hi), whole.slice(start_s=lo, end_s=hi)
        carried += bool(got.initial_windows_s)
        assert got == want
        assert list(got.initial_windows_s.items()) == list(want.initial_windows_s.items())
        assert [list(e.windows_s.items()) for e in got.events] == [
            list(e.windows_s.items()) for e in want.events
        ]
    assert carried  # some range starts while a stated window runs


_SACCT = "JobID|Start|End|NNodes|NodeList|Timelimit\n"
_SWF_JOB = "1 0 0 100 {procs} -1 -1 -1 200 -1 1 1 1 1 1 1 -1 -1\n"
_LSF_JOB = (
    '"JOB_FINISH" "10.1" 1700003602 1 1000 33554438 2 1700000000 0 {term} 1700000000 "a" "b" '
    '"" "" "" "l" "/h" "" "" "" "10/1" {asked} "batch1" 2 "n1" "n2" 64\n'
)
_PBS_JOB = (
    "11/14/2023 22:13:20;E;1.pbs01;qtime=1700000000 start=1700000000 exec_host=ANL-R00 "
    "Resource_List.nodect={nodect} end=1700003600\n"
)
DAMAGED_NUMBERS = {
    "swf processors inf": ("log.swf", "; MaxNodes: 8\n" + _SWF_JOB.format(procs="inf"),
                           "log.swf:2: field 5 'inf' is not a finite number"),
    "swf processors nan": ("log.swf", "; MaxNodes: 8\n" + _SWF_JOB.format(procs="nan"),
                           "log.swf:2: field 5 'nan' is not a finite number"),
    "swf header inf": ("log.swf", "; MaxNodes: inf\n" + _SWF_JOB.format(procs=2),
                       "header maxnodes 'inf' is not a finite number"),
    "lsf time inf": ("lsb.acct", _LSF_JOB.format(term="inf", asked=1),
                     "lsb.acct:1: termTime 'inf' is not a finite number"),
    "lsf asked hosts negative": ("lsb.acct", _LSF_JOB.format(term=1700003600, asked=-5),
                                 "lsb.acct:1: job 1: numAskedHosts -5 is negative"),
    "pbs nodect inf": ("acct.log", _PBS_JOB.format(nodect="inf"),
                       "job 1.pbs01: Resource_List.nodect 'inf' is not a finite number"),
    "pbs nodect 5000 digits": ("acct.log", _PBS_JOB.format(nodect="9" * 5000),
                               "(5,000 characters)' is not a finite number"),
    "pbs nodect half a node": ("acct.log", _PBS_JOB.format(nodect="0.5"),
                               "Resource_List.nodect 0.5 is not a whole number"),
    "sacct node count 5000 digits": (
        "sacct.txt", _SACCT + f"1|1700000000|1700000100|{'9' * 5000}|n1|10\n",
        "sacct.txt:2: job 1: node count of 5,000 digits is not a plausible count"),
    "sacct node count not ASCII": (
        "sacct.txt", _SACCT + "1|1700000000|1700000100|\u00b2|n[1-2]|10\n",
        "sacct.txt:2: job 1: node count '\u00b2' is not a whole number"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(DAMAGED_NUMBERS))
def test_numbers_past_their_type_are_one_line(case: str, tmp_path: Path) -> None:
    """inf, NaN, thousands of digits, half a node or a non-ASCII digit in a log's number
    gave an OverflowError or ValueError traceback (or, for half a node, a job of none)."""
    name, content, message = DAMAGED_NUMBERS[case]
    log = tmp_path / name
    log.write_text(content)
    out = tmp_path / "out.csv"
    done = bftrainer("trace", "from-log", str(log), "--out", str(out), "--nodes", "8")
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert not out.exists()


@pytest.mark.parametrize("count", ["\u00b2", "9" * 5000], ids=["superscript", "5000 digits"])
def test_a_down_count_past_its_type_is_one_line(count: str, tmp_path: Path) -> None:
    log = tmp_path / "log.swf"
    log.write_text("; MaxNodes: 8\n" + _SWF_JOB.format(procs=2))
    down = tmp_path / "down.txt"
    down.write_text(f"10,20,{count}\n")
    done = bftrainer("trace", "stats", str(log), "--down", str(down))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"{down}:1: down node count" in done.stderr


def test_a_limit_of_thousands_of_digits_is_no_plan(tmp_path: Path) -> None:
    """A Slurm Timelimit or PBS walltime past what int() and float() take is unknown (no
    window), as other text that is not a limit is, where it was a traceback."""
    huge = "9" * 5000
    for name, content in (
        ("sacct.txt", _SACCT + f"1|1700000000|1700000100|1|n1|{huge}\n"
         "2|1700000050|1700000100|1|n2|3-\u00b2:00:00\n"),
        ("acct.log", _PBS_JOB.replace("exec_host=ANL-R00", "exec_host=n1/0")
         .replace("nodect={nodect}", f"walltime={huge}")),
    ):  # fmt: skip
        log = tmp_path / name
        log.write_text(content)
        trace = convert(log, tmp_path / f"{name}.csv")
        windows = [*trace.initial_windows_s.values()]
        windows += [w for e in trace.events for w in e.windows_s.values()]
        assert set(windows) <= {None}  # open-ended only


@pytest.mark.parametrize("which", ["log", "log by another path", "node list", "down list"])
def test_out_never_replaces_an_input(which: str, tmp_path: Path) -> None:
    """`from-log LOG --out LOG` replaced the user's job log with the trace (exit 0); so did
    --out naming its --node-list or --down file."""
    log = tmp_path / "sacct.txt"
    log.write_text(w.sacct(w.random_jobs(3, MACHINE, 10)))
    nodes = tmp_path / "nodes.txt"
    nodes.write_text(f"n[0-{MACHINE - 1}]\n")
    down = tmp_path / "down.txt"
    down.write_text("1700000000,1700000060,n1\n")
    out, flag = {
        "log": (log, "LOG"),
        "log by another path": (tmp_path / "." / "sacct.txt", "LOG"),
        "node list": (nodes, "--node-list"),
        "down list": (down, "--down"),
    }[which]
    before = {p: p.read_bytes() for p in (log, nodes, down)}
    done = bftrainer(
        "trace", "from-log", str(log), "--node-list", str(nodes), "--down", str(down),
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 2, done.stdout
    assert f"--out {out} is {flag} " in done.stderr, done.stderr
    assert "the trace would replace its input" in done.stderr
    assert {p: p.read_bytes() for p in before} == before


def test_a_byte_order_mark_is_read_past(tmp_path: Path) -> None:
    """A log, node list or down list saved with a UTF-8 byte-order mark: the log was
    'unknown job-log format', and a node list's first node another name ('\\ufeffn0'), so
    every job on it was refused as on a node outside the list."""
    jobs = w.random_jobs(4, MACHINE, 10)
    plain, marked = tmp_path / "plain", tmp_path / "marked"
    for folder, bom in ((plain, ""), (marked, "\ufeff")):
        folder.mkdir()
        (folder / "log.txt").write_text(bom + w.sacct(jobs))
        (folder / "nodes.txt").write_text(bom + f"n[0-{MACHINE - 1}]\n")
        (folder / "down.txt").write_text(bom + f"{jobs[0].start_s:.0f},{jobs[0].end_s:.0f},n0\n")
    traces = []
    for f in (plain, marked):
        lists = ("--node-list", str(f / "nodes.txt"), "--down", str(f / "down.txt"))
        traces.append(convert(f / "log.txt", f / "out.csv", *lists))
    assert traces[0] == dataclasses.replace(traces[1], source=traces[0].source)
