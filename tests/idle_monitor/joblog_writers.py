"""Job logs written the way each scheduler writes them, from a list of jobs, for tests.

The Slurm lines follow what the local cluster's own ``jobcomp/filetxt`` and ``sacct -c
-P`` printed (tests/idle_monitor/test_joblog_slurm.py runs the real thing); LSF's the
field order of ``lsb.acct``'s ``JOB_FINISH`` (IBM's lsb.acct(5)); PBS's its accounting
``E`` records; SWF the Parallel Workloads Archive's 18 fields.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime

T0 = 1_700_000_000.0


@dataclass(frozen=True)
class Job:
    job_id: int
    submit_s: float
    start_s: float
    end_s: float
    nodes: tuple[str, ...]  # named; for count-only formats only the count is written
    limit_s: float


def random_jobs(seed: int, machine: int, count: int, *, overcommit: bool = False) -> list[Job]:
    """Jobs on nodes ``n0..``: each takes free nodes at its start (or, with
    ``overcommit``, any nodes), runs 1 s to 2 h, on a whole-second clock."""
    rng = random.Random(seed)
    names = [f"n{i}" for i in range(machine)]
    running: list[Job] = []
    out: list[Job] = []
    t = T0
    for k in range(count):
        t += rng.choice([0, 0, 1, 5, 30, 300, 1200])
        running = [j for j in running if j.end_s > t]
        busy = {n for j in running for n in j.nodes}
        free = [n for n in names if n not in busy]
        pool = names if overcommit else free
        if not pool:
            continue
        size = rng.randint(1, max(1, min(len(pool), machine // 3)))
        nodes = tuple(sorted(rng.sample(pool, size), key=names.index))
        run = rng.choice([1, 7, 60, 600, 3600, 7200])
        job = Job(
            k + 1, t - rng.choice([0, 10, 900]), t, t + run, nodes, run + rng.choice([0, 60, 1800])
        )
        running.append(job)
        out.append(job)
    return out


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _hostlist(nodes: tuple[str, ...]) -> str:
    nums = [int(n[1:]) for n in nodes]
    return "n[" + ",".join(str(x) for x in nums) + "]" if len(nums) > 1 else nodes[0]


def sacct(jobs: list[Job]) -> str:
    lines = ["JobID|Submit|Start|End|NNodes|NodeList|Timelimit|State"]
    for j in jobs:
        limit = int(j.limit_s // 60) + 1
        lines.append(
            f"{j.job_id}|{_iso(j.submit_s)}|{_iso(j.start_s)}|{_iso(j.end_s)}|{len(j.nodes)}|"
            f"{_hostlist(j.nodes)}|{limit}|COMPLETED"
        )
        lines.append(
            f"{j.job_id}.batch|{_iso(j.submit_s)}|{_iso(j.start_s)}|{_iso(j.end_s)}|1|"
            f"{j.nodes[0]}||COMPLETED"
        )
    return "\n".join(lines) + "\n"


def jobcomp(jobs: list[Job]) -> str:
    return "".join(
        f"JobId={j.job_id} UserId=root(0) GroupId=root(0) Name=wrap JobState=COMPLETED "
        f"Partition=main TimeLimit={int(j.limit_s // 60) + 1} StartTime={_iso(j.start_s)} "
        f"EndTime={_iso(j.end_s)} NodeList={_hostlist(j.nodes)} NodeCnt={len(j.nodes)} "
        f"ProcCnt={2 * len(j.nodes)} WorkDir=/home/a user ReservationName= "
        f"Tres=cpu=2,node={len(j.nodes)} Account= QOS= WcKey= Cluster=unknown "
        f"SubmitTime={_iso(j.submit_s)} EligibleTime={_iso(j.submit_s)} "
        "DerivedExitCode=0:0 ExitCode=0:0 \n"
        for j in jobs
    )


def lsb_acct(jobs: list[Job]) -> str:
    lines = []
    for j in jobs:
        slots = [n for n in j.nodes for _ in range(2)]  # a host once per slot
        fields = [
            '"JOB_FINISH"', '"10.1"', str(int(j.end_s) + 2), str(j.job_id), "1000", "33554438",
            str(len(slots)), str(int(j.submit_s)), "0", str(int(j.end_s)), str(int(j.start_s)),
            '"alice"', '"batch"', '"span[ptile=2]"', '""', '""', '"login1"', '"/home/a b"',
            '""', '""', '""', f'"10/{int(j.submit_s)}.{j.job_id}"', "1", '"batch1"',
            str(len(slots)), *(f'"{h}"' for h in slots), "64", "60.0", '""',
            '"jsrun ""./a.out"""',
            *(["-1"] * 19), '""', '"default"', "0", str(len(slots)),
        ]  # fmt: skip
        lines.append(" ".join(fields))
    return "\n".join(lines) + "\n"


def pbs(jobs: list[Job], *, cobalt: bool = False) -> str:
    lines = []
    for j in jobs:
        stamp = datetime.fromtimestamp(j.end_s, UTC).strftime("%m/%d/%Y %H:%M:%S")
        h, rest = divmod(int(j.limit_s), 3600)
        walltime = f"{h:02d}:{rest // 60:02d}:{rest % 60:02d}"
        hosts = (
            "location=ANL-R00-M0-512 exec_host=ANL-R00-M0-512"
            if cobalt
            else "exec_host=" + "+".join(f"{n}/0*64" for n in j.nodes)
            + " exec_vnode=" + "+".join(f"({n}:ncpus=64)" for n in j.nodes)
        )  # fmt: skip
        lines.append(
            f"{stamp};E;{j.job_id}.pbs01;user=alice queue=workq ctime={int(j.submit_s)} "
            f"qtime={int(j.submit_s)} start={int(j.start_s)} {hosts} "
            f"Resource_List.nodect={len(j.nodes)} Resource_List.walltime={walltime} "
            f"end={int(j.end_s)} Exit_status=0"
        )
    return "\n".join(lines) + "\n"


def swf(jobs: list[Job], machine: int) -> str:
    lines = ["; Version: 2.2", "; UnixStartTime: 0", f"; MaxNodes: {machine}"]
    for j in jobs:
        n = len(j.nodes)
        wait = int(j.start_s - j.submit_s)
        lines.append(
            f"{j.job_id} {int(j.submit_s)} {wait} {int(j.end_s - j.start_s)} {n} -1 -1 {n} "
            f"{int(j.limit_s)} -1 1 -1 -1 -1 -1 -1 -1 0"
        )
    return "\n".join(lines) + "\n"
