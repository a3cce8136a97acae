"""IBM Spectrum LSF as a pool source: ``bhosts -w`` for host states, ``bslots -l`` and the
allocation planner's plan for the claims on idle hosts, ``bjobs`` for bftrainer's own jobs.

LSF cannot run here; the parsers are tested on recorded outputs in the documented
formats (``idle_monitor/fixtures/lsf-*``). They are in ``lsf_hosts.py`` (what LSF says of
its hosts) and ``lsf_jobs.py`` (of the jobs: the plan, ``lsid``, ``bjobs``); this module
runs the commands and combines their readings (``LsfScheduler``).

- ``bhosts -w``: ``HOST_NAME STATUS JL/U MAX NJOBS RUN SSUSP USUSP RSV``. A host is idle
  when its status is ``ok`` and ``NJOBS`` is 0. A host with no running or suspended job
  but slots reserved (``RSV`` > 0) is held for a pending job: set aside, like Slurm's
  ``planned``, and in the pool only if its backfill window lasts beyond the horizon.
- ``bslots -l``: blocks of ``SLOTS:``, ``RUNTIME:`` (``UNLIMITED``, ``40 minutes``, ``1
  hour 30 minutes``) and ``HOSTS:`` (``n*host`` ..., possibly wrapped). Each block says
  that many slots stay free for that long; a host's whole-node window is the runtime of
  the block where it offers the most slots (the longest such). ``UNLIMITED`` is
  open-ended. LSF computes these windows from reservations (including those made for
  planned jobs) and advance reservations.
- The allocation plan (LSF 10.1 plan-based scheduling, ``ALLOCATION_PLANNER=Y``): the
  planner dumps it as JSON to ``$LSF_ENVDIR/../work/<cluster>/logdir/
  lsb.allocation.plan.json``; each entry names a pending job, its planned ``START_TIME``
  (epoch seconds) and its planned hosts (``ALLOC``). LSF reserves as little as it can for
  a plan, so a planned host may still show a long ``bslots`` window: the plan is the
  earlier, truer claim. The file is read with ``cat`` through the runner (so also over
  SSH); when it does not exist, planning is off and the claims come from ``bslots`` only.
- ``bjobs -u all -q QUEUE -o "jobid stat queue exec_host" -json`` lists bftrainer's own
  jobs (its preemptible queue). A host whose used slots (``bhosts`` ``RUN`` + ``SSUSP`` +
  ``USUSP``) all belong to those jobs counts as idle, as Slurm's ``--bf-partition`` does.
- Without ``-w`` LSF truncates long host names and marks them with ``*``; such a name is
  resolved to the one full name it can be (from ``bslots`` or an earlier reading), or
  the output is rejected as unparseable.
- ``lsload -gpu -w`` (only with ``--slots-per-node gres``): ``HOST_NAME status ngpus
  gpu_shared_avg_mut gpu_shared_avg_ut ngpus_physical``; a host's ``ngpus`` is its GPU
  count. A host it does not list has none; a ``-`` (the host's LIM unavailable) is that
  host's error, the others still count.
- OLCF's ``jobstat`` is a site wrapper, not part of LSF: it is not read.
"""

from __future__ import annotations

import logging
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from bftrainer.idle_monitor.lsf_hosts import (
    BHOSTS_COLUMNS,
    BackfillSlots,
    HostState,
    host_windows_s,
    parse_bhosts,
    parse_bslots,
    parse_lsload_gpus,
    parse_runtime_s,
    release_own,
)
from bftrainer.idle_monitor.lsf_jobs import (
    BJOBS_FIELDS,
    QUEUE_NAME,
    PlannedJob,
    QueueJob,
    bjobs_records,
    job_base_id,
    parse_bjobs_json,
    parse_exec_host,
    parse_lsid_cluster,
    parse_plan,
    plan_claims,
)
from bftrainer.idle_monitor.runner import (
    CommandFailedError,
    CommandResult,
    CommandRunner,
    ProgramNotFoundError,
)
from bftrainer.idle_monitor.source import (
    Claims,
    CommandOutputError,
    NodeStates,
    OutputParseError,
    Scheduler,
    merge_claims,
)

# The parsers live in lsf_hosts.py and lsf_jobs.py; their names stay importable from here.
__all__ = [
    "BHOSTS_COLUMNS",
    "BJOBS_FIELDS",
    "PLAN_AUTO",
    "PLAN_FILE_NAME",
    "BackfillSlots",
    "HostState",
    "LsfScheduler",
    "PlannedJob",
    "QueueJob",
    "bjobs_records",
    "host_windows_s",
    "job_base_id",
    "parse_bhosts",
    "parse_bjobs_json",
    "parse_bslots",
    "parse_exec_host",
    "parse_lsid_cluster",
    "parse_lsload_gpus",
    "parse_plan",
    "parse_runtime_s",
    "plan_claims",
    "release_own",
]

log = logging.getLogger(__name__)

PLAN_AUTO = "auto"  # --lsf-plan-file default: the documented path where commands run
PLAN_FILE_NAME = "lsb.allocation.plan.json"
# bjobs says this (stderr, non-zero exit) when a queue has no unfinished job.
_NO_JOBS = re.compile(r"^\s*No (?:\w+ )*job found", re.MULTILINE)
# Job states in which a job holds slots on its execution hosts.
_HOLDING_STATES = frozenset({"RUN", "SSUSP", "USUSP", "PROV"})


class LsfScheduler(Scheduler):
    """LSF through ``bhosts -w``, ``bslots -l``, the allocation plan and ``bjobs``.

    ``host_pattern`` (a regular expression) keeps only compute hosts, e.g. Summit's
    ``[a-h]\\d{2}n\\d{2}`` to leave out login and launch nodes.

    ``plan_file``: where the allocation plan is, on the machine the commands run on;
    ``"auto"`` finds it as IBM documents (``$LSF_ENVDIR/../work/<cluster>/logdir/``, with
    ``LSF_ENVDIR`` from ``printenv`` and the cluster from ``lsid``, once); ``None`` does not
    read it. When the file does not exist (planning off) the claims come from ``bslots``
    only, logged once and checked again every ``plan_recheck_s``.

    ``bf_queues``: bftrainer's own preemptible queues; hosts held only by their jobs count
    as idle (one ``bjobs`` per queue and poll), and their pending jobs' plan entries are
    ignored (from the previous poll's ``bjobs``, since claims are read before nodes).

    ``read_gpus``: also read each host's GPU count (``lsload -gpu -w``, one per poll).
    """

    name = "lsf"
    gpu_field = "lsload -gpu's ngpus"

    def __init__(
        self,
        *,
        host_pattern: str | None = None,
        plan_file: str | None = PLAN_AUTO,
        bf_queues: Sequence[str] = (),
        plan_recheck_s: float = 600.0,
        plan_overdue_s: float = 600.0,
        read_gpus: bool = False,
    ) -> None:
        for queue in bf_queues:
            if not QUEUE_NAME.fullmatch(queue):
                raise ValueError(f"bad LSF queue name {queue!r}")
        if plan_file is not None and plan_file != PLAN_AUTO and not plan_file.startswith("/"):
            raise ValueError(
                f"plan file {plan_file!r} is not an absolute path (or 'auto', or None)"
            )
        if plan_recheck_s < 0 or plan_overdue_s < 0:
            raise ValueError(
                f"plan_recheck_s and plan_overdue_s must be >= 0, got {plan_recheck_s}, "
                f"{plan_overdue_s}"
            )
        self.host_pattern = re.compile(host_pattern) if host_pattern else None
        self.plan_file = plan_file
        self.bf_queues = tuple(bf_queues)
        self.plan_recheck_s = plan_recheck_s
        self.plan_overdue_s = plan_overdue_s
        self.read_gpus = read_gpus
        self._known_hosts: set[str] = set()
        self._listed_hosts: frozenset[str] = frozenset()  # every bhosts row, last reading
        self._own_job_ids: frozenset[str] = frozenset()
        self._plan_path: str | None = None if plan_file == PLAN_AUTO else plan_file
        self._plan_located = plan_file != PLAN_AUTO
        self._plan_absent_s: float | None = None  # when the plan file was last found absent
        self._overdue_ids: frozenset[str] = frozenset()
        self._unknown_hosts: frozenset[str] = frozenset()

    @staticmethod
    def bhosts_argv() -> list[str]:
        return ["bhosts", "-w"]

    @staticmethod
    def bslots_argv() -> list[str]:
        return ["bslots", "-l"]

    @staticmethod
    def bjobs_argv(queue: str) -> list[str]:
        return ["bjobs", "-u", "all", "-q", queue, "-o", BJOBS_FIELDS, "-json"]

    @staticmethod
    def plan_argv(path: str) -> list[str]:
        return ["cat", path]

    @staticmethod
    def envdir_argv() -> list[str]:
        return ["printenv", "LSF_ENVDIR"]

    @staticmethod
    def lsid_argv() -> list[str]:
        return ["lsid"]

    @staticmethod
    def gpus_argv() -> list[str]:
        return ["lsload", "-gpu", "-w"]

    @property
    def plan_path(self) -> str | None:
        """The plan file in use (None: not located yet, or not read)."""
        return self._plan_path

    def _keep(self, host: str) -> bool:
        return self.host_pattern is None or bool(self.host_pattern.fullmatch(host))

    # ------------------------------------------------------------------ nodes

    def requirements(self, env: Callable[[str], str | None]) -> tuple[list[str], list[str]]:
        needed = ["bhosts", "bslots", *(["bjobs"] if self.bf_queues else [])]
        return needed + (["lsload"] if self.read_gpus else []), []

    def read_nodes(self, runner: CommandRunner, now_s: float) -> NodeStates:
        argv = self.bhosts_argv()
        out = runner.run(argv).stdout
        try:
            rows = parse_bhosts(out, self._known_hosts)
        except OutputParseError as exc:
            raise CommandOutputError(argv, runner.where, f"unparseable output: {exc}") from None
        if self.bf_queues:
            own_slots, own_ids = self.read_own_jobs(runner)
            released = [release_own(r, own_slots.get(r.name, 0)) for r in rows]
            held = [r.name for r, new in zip(rows, released, strict=True) if new is not r]
            if held:
                log.debug("lsf: %d host(s) held only by bftrainer's jobs count as idle", len(held))
            rows, self._own_job_ids = released, own_ids
        self._listed_hosts = frozenset(r.name for r in rows)
        rows = [r for r in rows if self._keep(r.name)]
        if not rows:
            raise CommandOutputError(argv, runner.where, "no host matches the host pattern")
        self._known_hosts.update(r.name for r in rows)
        states = NodeStates(
            time_s=now_s,
            nodes=frozenset(r.name for r in rows),
            idle=frozenset(r.name for r in rows if r.kind == "idle"),
            set_aside=frozenset(r.name for r in rows if r.kind == "set_aside"),
        )
        if not self.read_gpus:
            return states
        argv = self.gpus_argv()
        try:
            gpus, errors = parse_lsload_gpus(runner.run(argv).stdout)
        except OutputParseError as exc:
            raise CommandOutputError(argv, runner.where, f"unparseable output: {exc}") from None
        return replace(
            states,
            gpus={h: gpus.get(h, 0) for h in states.nodes if h not in errors},  # unlisted: none
            gpu_errors={h: why for h, why in errors.items() if h in states.nodes},
        )

    def read_own_jobs(self, runner: CommandRunner) -> tuple[dict[str, int], frozenset[str]]:
        """Slots per host held by jobs of ``bf_queues``, and all their job ids (pending
        ones too). A queue with no job (``No unfinished job found``) gives nothing."""
        slots: dict[str, int] = {}
        ids: set[str] = set()
        for queue in self.bf_queues:
            argv = self.bjobs_argv(queue)
            result = runner.run(argv, check=False)
            if result.returncode != 0:
                if _NO_JOBS.search(result.stderr) or _NO_JOBS.search(result.stdout):
                    continue
                raise CommandFailedError(result, runner.where)
            if not result.stdout.lstrip().startswith("{") and _NO_JOBS.search(result.stdout):
                continue
            try:
                jobs = parse_bjobs_json(result.stdout)
            except OutputParseError as exc:
                raise CommandOutputError(argv, runner.where, f"unparseable output: {exc}") from None
            for job in jobs:
                if job.queue != queue:
                    continue
                ids.add(job_base_id(job.job_id))
                if job.stat in _HOLDING_STATES:
                    for host, n in job.slots:
                        slots[host] = slots.get(host, 0) + n
        return slots, frozenset(ids)

    # ------------------------------------------------------------------ claims

    def read_claims(self, runner: CommandRunner, now_s: float) -> Claims:
        argv = self.bslots_argv()
        out = runner.run(argv).stdout
        try:
            blocks = parse_bslots(out)
        except OutputParseError as exc:
            raise CommandOutputError(argv, runner.where, f"unparseable output: {exc}") from None
        windows = host_windows_s(blocks)
        self._known_hosts.update(h for h in windows if not h.endswith("*"))
        backfill = {h: now_s + w for h, w in windows.items() if w is not None and self._keep(h)}
        planned = self.read_plan_claims(runner, now_s)
        claims = merge_claims(backfill, planned)
        log.debug(
            "lsf: %d backfill block(s), %d host(s) with a window, %d planned host(s)",
            len(blocks),
            len(backfill),
            len(planned),
        )
        return Claims(now_s, claims)

    def read_plan_claims(self, runner: CommandRunner, now_s: float) -> dict[str, float]:
        """Host -> planned start from the allocation plan; empty when planning is off."""
        path = self._locate_plan(runner)
        if path is None:
            return {}
        text = self._read_plan_text(runner, path, now_s)
        if text is None:
            return {}
        try:
            jobs = parse_plan(text)
        except OutputParseError as exc:
            raise CommandOutputError(
                self.plan_argv(path), runner.where, f"unparseable allocation plan: {exc}"
            ) from None
        claims, overdue = plan_claims(
            jobs, now_s, overdue_s=self.plan_overdue_s, skip_ids=self._own_job_ids
        )
        self._note_overdue(overdue, path, now_s)
        claims = {h: t for h, t in claims.items() if self._keep(h)}
        self._note_unknown(claims, path)
        return claims

    def _note_overdue(self, overdue: list[PlannedJob], path: str, now_s: float) -> None:
        ids = frozenset(j.job_id for j in overdue)
        if ids and ids != self._overdue_ids:
            late = max(now_s - j.start_s for j in overdue)
            log.info(
                "lsf: ignoring %d plan entr%s of %s whose start passed up to %.0f s ago "
                "(more than %.0f s; stale plan?): %s",
                len(ids),
                "y" if len(ids) == 1 else "ies",
                path,
                late,
                self.plan_overdue_s,
                ", ".join(sorted(ids)[:5]),
            )
        self._overdue_ids = ids

    def _note_unknown(self, claims: Mapping[str, float], path: str) -> None:
        if not self._listed_hosts:
            return  # bhosts not read yet: nothing to compare with
        unknown = frozenset(claims) - self._listed_hosts
        if unknown and unknown != self._unknown_hosts:
            log.warning(
                "lsf: the allocation plan %s names %d host(s) that bhosts does not list "
                "(%s): their claims cannot matter",
                path,
                len(unknown),
                ", ".join(sorted(unknown)[:5]),
            )
        self._unknown_hosts = unknown

    def _locate_plan(self, runner: CommandRunner) -> str | None:
        """The plan path; with ``auto`` found once from ``LSF_ENVDIR`` and ``lsid``.

        An unset ``LSF_ENVDIR`` or a missing ``lsid`` turns plan reading off (logged
        once); a failing ``lsid`` (LIM down) raises, and the next poll tries again.
        """
        if self._plan_located:
            return self._plan_path
        envdir = _run_if_present(runner, self.envdir_argv())
        reason = None
        if envdir is None:
            reason = "printenv is missing"
        elif envdir.returncode != 0 or not envdir.stdout.strip():
            reason = f"LSF_ENVDIR is not set where the commands run ({runner.where})"
        if reason is None:
            lsid = _run_if_present(runner, self.lsid_argv())
            if lsid is None:
                reason = f"lsid is missing where the commands run ({runner.where})"
            elif lsid.returncode != 0:
                raise CommandFailedError(lsid, runner.where)
            else:
                try:
                    cluster = parse_lsid_cluster(lsid.stdout)
                except OutputParseError as exc:
                    raise CommandOutputError(
                        self.lsid_argv(), runner.where, f"unparseable output: {exc}"
                    ) from None
                assert envdir is not None
                base = envdir.stdout.strip().splitlines()[0].rstrip("/")
                self._plan_path = posixpath.join(
                    base, "..", "work", cluster, "logdir", PLAN_FILE_NAME
                )
                log.info("lsf: reading the allocation plan from %s", self._plan_path)
        if reason is not None:
            log.warning(
                "lsf: cannot locate the allocation plan (%s): claims come from bslots only; "
                "give its path with --lsf-plan-file, or 'none'",
                reason,
            )
        self._plan_located = True
        return self._plan_path

    def _read_plan_text(self, runner: CommandRunner, path: str, now_s: float) -> str | None:
        """The plan file's text, or None when it does not exist (planning off)."""
        if self._plan_absent_s is not None and now_s - self._plan_absent_s < self.plan_recheck_s:
            return None
        result = runner.run(self.plan_argv(path), check=False)
        if result.returncode != 0:
            if "No such file or directory" not in result.stderr:
                raise CommandFailedError(result, runner.where)
            if self._plan_absent_s is None:
                log.warning(
                    "lsf: no allocation plan at %s: plan-based scheduling is off "
                    "(ALLOCATION_PLANNER in lsb.params), so claims come from bslots only; "
                    "looking again every %.0f s",
                    path,
                    self.plan_recheck_s,
                )
            self._plan_absent_s = now_s
            return None
        if self._plan_absent_s is not None:
            log.info("lsf: allocation plan found at %s", path)
            self._plan_absent_s = None
        return result.stdout


def _run_if_present(runner: CommandRunner, argv: list[str]) -> CommandResult | None:
    """The command's result (any exit code), or None when its program does not exist
    (locally, or exit 127 from the login shell over SSH)."""
    try:
        result = runner.run(argv, check=False)
    except ProgramNotFoundError:
        return None
    return None if result.returncode == 127 else result
