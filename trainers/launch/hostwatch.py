"""The supervisor's own view of which of its hosts it may still use.

The driver (the daemon) tells a trainer its hosts, but a host can be lost while the
driver is away: its holder job is preempted by a main job, released, cancelled by hand
or reaches its time limit. Waiting for the driver would let the backend retry on the
lost host until the trainer fails, so the supervisor asks the scheduler itself, as
Elastic Horovod's host discovery does, and goes on with the hosts that remain.

In ``slurm`` mode (``exec.json``) a host is usable while it has a holder job and that
job runs and was not preempted (``PreemptTime`` is set the moment Slurm preempts, before
any signal is sent); ``squeue``'s reply is read by :mod:`bftrainer.common.squeue`, the parser
the daemon reads its holders with. In the other modes every host the driver gave is
used. The watch also renews the holder leases of its hosts (``exec.json``'s ``leases``;
see ``scripts/slurm/hold-nodes.sbatch``), so a node stays held while a trainer runs on
it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from bftrainer.common import squeue
from bftrainer.trainers import channel

logger = logging.getLogger("bftrainer.supervisor")

Hosts = list[tuple[str, int]]
# Listed in these states and not preempted, a holder may still be (or become) ours.
_ALIVE = frozenset({"RUNNING", "PENDING", "CONFIGURING"})


def env_seconds(name: str, default: float) -> float:
    """A delay from the environment (tests shorten production delays so), else ``default``."""
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


def holder_jobs_gone(jobs: Collection[str], timeout_s: float = 20.0) -> set[str] | None:
    """The Slurm jobs among ``jobs`` that ended or were preempted, by one ``squeue``;
    None when Slurm cannot tell now (it is down, slow, or answered something else)."""
    if not jobs:
        return set()
    argv = ["squeue", "-h", "-t", "all", "-j", ",".join(sorted(jobs)), "-O", squeue.FORMAT]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, **squeue.TIME_ENV},
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as e:
        logger.warning("cannot ask Slurm about the holders (%s): keeping every host", e)
        return None
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:  # none of them is known any more
            return set(jobs)
        logger.warning("squeue exited %d: %s", done.returncode, done.stderr.strip()[:200])
        return None
    try:
        listed = squeue.parse_squeue_jobs(done.stdout)
    except ValueError as e:
        logger.warning("squeue: unusable reply (%s): keeping every host", e)
        return None
    return jobs_gone(jobs, listed)


def jobs_gone(jobs: Collection[str], listed: Iterable[squeue.SqueueJob]) -> set[str]:
    """The jobs among ``jobs`` that are not listed alive: in a state where a holder may
    still be ours, and not preempted."""
    alive = {j.job_id for j in listed if j.state.rstrip("+") in _ALIVE and not j.preempted}
    return set(jobs) - alive


class HostWatch:
    """Filters the driver's hosts down to those still usable (see the module)."""

    def __init__(self, trainer_dir: Path) -> None:
        self.dir = trainer_dir
        self.check_every_s = env_seconds("BFTRAINER_HOLDER_CHECK_S", 10.0)
        self._gone: set[tuple[str, str]] = set()  # (host, holder job) never usable again
        self._next_check = 0.0
        self._renewed_at = -float("inf")
        self._said: set[tuple[str, str]] = set()

    def _exec(self) -> dict[str, Any]:
        try:
            return channel.read_exec(self.dir) or {"mode": "ssh", "slurm_jobs": {}}
        except channel.ChannelError as e:
            logger.warning("%s: using every host as given", e)
            return {"mode": "ssh", "slurm_jobs": {}}

    def usable(self, hosts: Hosts, *, look_now: bool = False) -> Hosts:
        """``hosts`` less those lost; ``look_now`` asks the scheduler at once (workers
        just died), else at most every ``check_every_s``."""
        config = self._exec()
        self._renew_leases(config, hosts)
        if config.get("mode") != "slurm":
            return hosts
        jobs: dict[str, str] = config.get("slurm_jobs", {})
        if hosts and (look_now or time.monotonic() >= self._next_check):
            self._next_check = time.monotonic() + self.check_every_s
            ours = {h: jobs[h] for h, _ in hosts if h in jobs}
            gone = holder_jobs_gone(set(ours.values()))
            if gone:
                self._gone |= {(h, j) for h, j in ours.items() if j in gone}
        out: Hosts = []
        for host, slots in hosts:
            job = jobs.get(host)
            if job is not None and (host, job) not in self._gone:
                out.append((host, slots))
                continue
            key = (host, job or "")
            if key not in self._said:
                self._said.add(key)
                why = "has no holder job" if job is None else f"lost its holder job {job}"
                logger.warning("host %s %s: going on without it", host, why)
        return out

    def _renew_leases(self, config: dict[str, Any], hosts: Hosts) -> None:
        leases: dict[str, str] = config.get("leases") or {}
        lease_s = config.get("lease_s")
        if not leases or not lease_s or not hosts:
            return
        now = time.time()
        if now - self._renewed_at < lease_s / 4:
            return
        self._renewed_at = now
        for host, _ in hosts:
            path = leases.get(host)
            if path is None:
                continue
            try:
                channel.renew_lease(path, now + lease_s)
            except OSError as e:
                logger.warning("cannot renew the lease of %s (%s): %s", host, path, e)
