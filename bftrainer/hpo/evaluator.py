"""A DeepHyper ``Evaluator`` whose workers are bftrainer trainers.

DeepHyper's searches (CBO, random, ...) call an evaluator's ``execute(job)`` once per
configuration (its contract: deephyper/evaluator/_evaluator.py). Here ``execute`` waits
until the daemon's pool has room (:func:`~bftrainer.hpo.campaign.room`, as an Optuna
campaign does), submits the configuration as a trainer of ``spec`` (its parameters as
options, ``--trial NAME#K``), passes each ``runtime.report`` to the search's early
stopper (``RunningJob.record`` then ``stopped``, as a DeepHyper run-function does) and
cancels the trainer when the stopper says stop. The job's output is its trainer's end:
``done`` and a stopped trainer that ended ``cancelled`` give the last reported value,
anything else a failure (DeepHyper's ``"F_..."`` objective). So a search runs unchanged:

    search = CBO(problem, TrainerEvaluator(spec, store, "digits"), stopper=stopper)
    search.search(max_evals=24)

``num_workers`` follows the pool: the trials that run plus those its room fits now,
within ``max_parallel``. DeepHyper reads it once, when its search starts, then asks as
many configurations as ends it gathers; so while :meth:`gather` waits for an end, the
evaluator asks the search (``search.ask``, public) for the configurations the pool has
grown to fit (docs/hpo.md, "DeepHyper"). Each trial's promise (the rungs DeepHyper's
stopper passed it) is stored with its trainer, as an Optuna campaign's. A restarted
search (``checkpoint_restart=True``) adopts the trainers that a killed one started and
never told: they run on and are told once (docs/hpo.md, "DeepHyper").
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deephyper.evaluator import Evaluator, Job, JobStatus

from bftrainer.common.promise import rungs_passed
from bftrainer.hpo.campaign import (
    TRIAL_OPTION,
    CampaignError,
    DaemonWatch,
    TrialSpec,
    checked_name,
    checked_poll_s,
    checked_trials,
    room,
    submit_trial,
    trainers_by_trial,
)
from bftrainer.hpo.space import SpaceError, as_args, check_name
from bftrainer.state import Store, TrainerRow
from bftrainer.trainers import channel

log = logging.getLogger(__name__)

META_TRAINER = "trainer"  # the job's metadata (results.csv's m:trainer): its trainer's id
META_END = "trainer_end"  # done, cancelled or failed
META_PRUNED = "pruned"  # True: the stopper ended it (its trainer was cancelled for it)


@dataclass
class _Followed:
    """What ``execute`` has read of one trainer: reports by samples, and the last value."""

    seen: set[int] = field(default_factory=set)
    offset: int = 0
    last: float | None = None
    stopped: bool = False


class TrainerEvaluator(Evaluator):
    """DeepHyper's evaluator on the daemon of ``store``: each configuration is a trainer
    of ``spec``, named ``NAME#K`` (``name``). DeepHyper maximises: with ``maximize``
    False (a loss, as the examples report) the objective is minus the reported value.
    A report at ``samples_done`` is the stopper's budget ``samples_done /
    budget_samples``; a stopper's ``max_steps`` counts the same units."""

    def __init__(
        self,
        spec: TrialSpec,
        store: Store,
        name: str,
        *,
        maximize: bool = False,
        budget_samples: float = 1.0,
        max_parallel: int | None = None,
        poll_s: float = 5.0,
        callbacks: list[Any] | None = None,
    ) -> None:
        checked_name(name, "search name")
        if not (math.isfinite(budget_samples) and budget_samples > 0):
            raise CampaignError(f"budget_samples {budget_samples!r}: must be > 0")
        self.spec, self.store, self.name = checked_trials(spec, max_parallel), store, name
        self.sign = 1.0 if maximize else -1.0
        self.budget_samples, self.max_parallel = budget_samples, max_parallel
        self.poll_s = checked_poll_s(poll_s)
        self._adopt: dict[str, str] = {}  # DeepHyper job id -> the trainer it adopts
        self._adopted = False
        self._ended = self._gathered = 0  # executes that returned; results gathered
        self._watch = DaemonWatch(store)
        super().__init__(run_function=None, callbacks=callbacks)

    # -- what DeepHyper asks ---------------------------------------------------------
    @property
    def num_workers(self) -> int:
        """The trials that run plus those the pool's room fits now (at least 1)."""
        fit = len(self._unfinished()) + max(0, room(self.store)) // self.spec.n_min
        if self.max_parallel is not None:
            fit = min(fit, self.max_parallel)
        return max(1, fit)

    @num_workers.setter
    def num_workers(self, value: int | None) -> None:
        """DeepHyper's base class sets it; the pool decides instead."""

    def to_json(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "num_workers": self.num_workers, "name": self.name}

    def submit(self, args_list: list[dict[str, Any]]) -> None:
        """The search's configurations; before the first, those of trainers a killed
        search started and never told (their results are not in the search's history)."""
        for params in args_list:
            for name in params:
                try:
                    check_name(name)
                except SpaceError as exc:
                    raise CampaignError(f"search {self.name!r}: {exc}") from None
        if not self._adopted:
            self._adopted = True
            gaps, orphans = self._gaps(), self._orphans()
            if orphans:
                log.info("adopting %d trial(s) of a search that was stopped", len(orphans))
                with _ids_from(self._storage, gaps[: len(orphans)]):
                    super().submit([params for params, _ in orphans])
                for job, (_, row) in zip(self.jobs[-len(orphans) :], orphans, strict=True):
                    self._adopt[job.id] = row.id
            lost = gaps[len(orphans) :]
            if lost:
                log.warning(
                    "%d configuration(s) of the stopped search never got a trainer: lost, "
                    "and counted as gathered (the search runs that many fewer)",
                    len(lost),
                )
                self.job_id_gathered.extend(lost)
        super().submit(args_list)

    def gather(self, type: str, size: int = 1) -> Any:
        """DeepHyper's ``gather``, which waits for an end; meanwhile, more configurations
        are asked of the search when the pool fits more trials than are in flight."""
        if type == "BATCH" and self.search is not None and self.loop is not None:
            self.loop.run_until_complete(self._grow_until_an_end())
        results = super().gather(type, size)
        self._gathered += len(results[0] if isinstance(results, tuple) else results)
        return results

    async def execute(self, job: Job) -> Job:
        try:
            return await self._execute_trial(job)
        finally:
            self._ended += 1

    async def _execute_trial(self, job: Job) -> Job:
        seen = _Followed()
        trainer_id = self._adopt.pop(job.id, None)
        if trainer_id is None:
            while not self._may_start():
                await asyncio.sleep(self.poll_s)
            trainer_id = self._submit(job.args)
        elif trainer_id in self.stopped_marks():  # stopped by the search that was killed
            seen.stopped = True
            if not self.store.trainer(trainer_id).finished:
                self.store.request_cancel(trainer_id)  # again: harmless if it was asked
        job.status = JobStatus.RUNNING
        running = job.create_running_job(self._stopper)
        while True:
            # The row is read before the reports: an ended trainer has written them all.
            row = self.store.trainer(trainer_id)
            self._follow(row, running, seen)
            if row.finished:
                break
            await asyncio.sleep(self.poll_s)
        return self._update_job_when_done(job, self._output(row, seen))

    # -- inside ------------------------------------------------------------------------
    async def _grow_until_an_end(self) -> None:
        """Until a job of this evaluator has ended (what ``gather`` then collects), ask
        the search every ``poll_s`` for as many configurations as the pool fits beyond
        those in flight (:meth:`_grow`)."""
        while self._ended <= self._gathered and self.job_id_submitted:
            self._watch.check()
            self._grow()
            await asyncio.sleep(self.poll_s)

    def _grow(self) -> None:
        """Submit the configurations the pool fits beyond those in flight (running,
        waiting for room, or ended and not gathered), asked of the search. A model-based
        search asked for one point between two tells proposes the one it proposed last
        (skopt's ``ask``): at least two are asked, and one already in flight is dropped."""
        if room(self.store) < self.spec.n_min:  # as a rule: the pool fits no more
            return
        if self.time_left is not None and self.time_left <= 0:  # the search's timeout
            return
        in_flight = set(self.job_id_submitted)
        extra = self.num_workers - len(in_flight)
        if self.maximum_num_jobs_submitted > 0:  # max_evals_strict
            extra = min(extra, self.maximum_num_jobs_submitted - self.num_jobs_submitted)
        if extra <= 0 or self.search is None:
            return
        flying = [job.args for job in self.jobs if job.id in in_flight]
        fresh: list[dict[str, Any]] = []
        for config in self.search.ask(max(extra, 2)):
            if config not in flying and config not in fresh and len(fresh) < extra:
                fresh.append(config)
        if fresh:
            log.info("the pool fits %d more trial(s): %d configuration(s) asked", extra, len(fresh))
            self.submit(fresh)

    def _trainers(self) -> dict[str, TrainerRow]:
        prefix = f"{self.name}#"
        return {k: r for k, r in trainers_by_trial(self.store).items() if k.startswith(prefix)}

    def _unfinished(self) -> list[TrainerRow]:
        return [r for r in self._trainers().values() if not r.finished]

    @property
    def _marks_key(self) -> str:
        return f"hpo-stopped:{self.name}"

    def stopped_marks(self) -> dict[str, float]:
        """The trainers this search's stopper stopped, with when (the daemon's store)."""
        return dict(self.store.get_setting(self._marks_key, {}))

    def _may_start(self) -> bool:
        if self.max_parallel is not None and len(self._unfinished()) >= self.max_parallel:
            return False
        return room(self.store) >= self.spec.n_min

    def _submit(self, params: Mapping[str, Any]) -> str:
        """Queue the configuration's trainer: one commit, so a kill leaves it or not."""
        name = f"{self.name}#{len(self._trainers())}"
        trainer_id = submit_trial(self.store, self.spec, as_args(_plain(params)), name)
        log.info("%s -> trainer %s: %s", name, trainer_id, dict(params))
        return trainer_id

    def _follow(self, row: TrainerRow, running: Any, seen: _Followed) -> None:
        """Each new report to the stopper; cancel the trainer when it says stop before
        the trainer's work is done."""
        if row.trainer_dir is None:
            return
        reports, offset = channel.read_reports(Path(row.trainer_dir), seen.offset)
        for r in reports:
            samples = int(r["samples_done"])
            if samples in seen.seen:
                continue
            value = self.sign * float(r["value"])
            running.record(samples / self.budget_samples, value)
            seen.seen.add(samples)
            seen.last = value
            at_end = samples >= self.spec.work_samples
            stop = running.stopped()  # once per report: the stopper counts its rungs
            if not (stop or seen.stopped or row.finished):
                self._mark(row, running)
            if stop and not (seen.stopped or row.finished or at_end):
                seen.stopped = True
                # The mark first, then the cancel: a restart tells a trainer cancelled
                # for the stopper (pruned) from one cancelled by hand (failed).
                marks = {**self.stopped_marks(), row.id: time.time()}
                self.store.set_setting(self._marks_key, marks)
                self.store.request_cancel(row.id)
                log.info("trainer %s stopped early at %d samples", row.id, samples)
        # Only once all are taken: a step that raised reads them again (as a campaign).
        seen.offset = offset

    def _mark(self, row: TrainerRow, running: Any) -> None:
        """Store the trial's promise with its trainer: the rungs DeepHyper's stopper
        passed it (``_completed_rung_K`` in the job's metadata), as a campaign does."""
        metadata = running.storage.load_job(running.id).get("metadata") or {}
        rungs = rungs_passed(metadata)
        if rungs != row.rungs:
            self.store.set_rungs(row.id, rungs)

    def _output(self, row: TrainerRow, seen: _Followed) -> dict[str, Any]:
        pruned = row.state == "cancelled" and seen.stopped
        meta = {META_TRAINER: row.id, META_END: row.state, META_PRUNED: pruned}
        if row.state == "done" or pruned:
            if seen.last is None:
                return {"objective": "F_no_report", "metadata": meta}
            return {"objective": seen.last, "metadata": meta}
        return {"objective": f"F_{row.state}", "metadata": meta}

    def _orphans(self) -> list[tuple[dict[str, Any], TrainerRow]]:
        """Trainers of this search that no job of the search's history names."""
        told = {str(j.metadata.get(META_TRAINER)) for j in self._history()}
        told |= set(self._adopt.values())
        out = []
        for row in sorted(self._trainers().values(), key=lambda r: r.submit_s):
            if row.id not in told:
                out.append((params_of(row.args, len(self.spec.args)), row))
        return out

    def _gaps(self) -> list[str]:
        """Job ids the stopped search made and never told. DeepHyper's restart numbers the
        reloaded results' jobs 0..max, so a job in flight at the kill below that max is an
        id nothing gathers, and the search's last collect would wait for it forever
        (spinning a core). The orphans take these ids (:func:`_ids_from`)."""
        known = {*self.job_id_gathered, *self.job_id_submitted}
        return [j for j in self._storage.load_all_job_ids(self._search_id) if j not in known]

    def _history(self) -> Sequence[Job]:
        search = getattr(self, "search", None)
        history = getattr(search, "history", None)
        return list(getattr(history, "jobs", []))


@contextmanager
def _ids_from(storage: Any, ids: Sequence[str]) -> Iterator[None]:
    """Within: the storage's new jobs take ``ids`` (existing ones) first, then new ids."""
    given = iter(ids)
    make = storage.create_new_job
    storage.create_new_job = lambda search_id: next(given, None) or make(search_id)
    try:
        yield
    finally:
        del storage.create_new_job


def params_of(args: Sequence[str], skip: int) -> dict[str, Any]:
    """A trainer's parameters from its arguments (``as_args``'s ``--NAME VALUE`` after the
    spec's own ``skip`` arguments, up to ``--trial``): ints, floats, else strings."""
    out: dict[str, Any] = {}
    rest = list(args[skip:])
    while len(rest) >= 2 and rest[0] != TRIAL_OPTION:
        name, text = rest[0].removeprefix("--"), rest[1]
        rest = rest[2:]
        value: Any = text
        for kind in (int, float):
            try:
                value = kind(text)
                break
            except ValueError:
                continue
        out[name] = value
    return out


def _plain(params: Mapping[str, Any]) -> dict[str, Any]:
    """numpy scalars as Python's (``repr`` of a numpy float is not a number)."""
    return {k: v.item() if hasattr(v, "item") else v for k, v in params.items()}
