"""A campaign: an Optuna study whose trials run as trainers on a daemon's pool.

One :meth:`Campaign.step` follows every running trial (its trainer's reports go to the
study, whose pruner may end it; its trainer's end is told to the study) and then asks
the study for new trials while the pool can run one more. Nothing is kept in memory
that a restart needs: the trial -> trainer link is the ``--trial`` option in the
trainer's arguments (in the daemon's store) and a user attribute of the trial (in the
study's storage), so a campaign killed at any point and started again neither loses nor
doubles a trial (docs/hpo.md, "Restarts").
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from bftrainer.common.promise import rungs_passed
from bftrainer.hpo.space import as_args
from bftrainer.state import DEFAULT_RESCALE_S, Store, TrainerRow, daemon_running
from bftrainer.trainers import channel

log = logging.getLogger(__name__)
# What Optuna raises when its database fails; only a lock held by another program past
# the database's wait (``LOCK_WORDS`` in the driver's message) is waited out.
STORAGE_ERRORS = (optuna.exceptions.StorageInternalError, sqlalchemy.exc.OperationalError)
LOCK_WORDS = (
    "database is locked",  # SQLite
    "database table is locked",
    "database is busy",
    "lock wait timeout",  # MySQL
    "could not obtain lock",  # PostgreSQL
    "deadlock",
    "could not serialize",
)
STORAGE_BUSY_MAX_S = 600.0


def storage_busy(exc: BaseException) -> bool:
    """Whether a storage error is another program's lock, which passes, rather than a
    lasting fault (a table missing, a full disk), which waiting would only hide."""
    e: BaseException | None = exc
    for _ in range(8):  # Optuna's error, SQLAlchemy's (its text holds the driver's), ...
        if e is None:
            return False
        if any(w in str(e).lower() for w in LOCK_WORDS):
            return True
        e = e.__cause__ or e.__context__
    return False


def first_line(exc: BaseException) -> str:
    """A storage error in one line: its cause's first (SQLAlchemy adds a URL on another)."""
    cause = exc.__cause__ or exc
    return str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__


# What opening a study's storage raises: a URL that does not parse or names no database
# (SQLAlchemy's ArgumentError, OperationalError), a driver not installed (ImportError).
OPEN_ERRORS = (*STORAGE_ERRORS, sqlalchemy.exc.SQLAlchemyError, ImportError)

TRIAL_OPTION = "--trial"  # the runtime's option (trainers/runtime_options.py)
ATTR_TRAINER = "bftrainer_trainer"  # the trainer id that runs the trial
ATTR_PRUNED = "bftrainer_pruned"  # the samples at which the pruner ended it
ATTR_END = "bftrainer_end"  # why a trial failed, in one line


class CampaignError(RuntimeError):
    """The campaign cannot run as asked (another campaign runs the study, bad input)."""


MAX_POLL_S = 3600.0  # as `bftrainer hpo --poll-interval`


def checked_poll_s(poll_s: float) -> float:
    """A poll interval a script gave: seconds, > 0 and at most an hour. A negative one
    spun a core; NaN or 1e12 died in the sleep with a traceback."""
    if isinstance(poll_s, bool) or not isinstance(poll_s, int | float):
        raise CampaignError(f"poll_s = {poll_s!r}: expected seconds")
    if not (math.isfinite(poll_s) and 0 < poll_s <= MAX_POLL_S):
        raise CampaignError(f"poll_s = {poll_s!r}: expected seconds > 0 and <= {MAX_POLL_S:g}")
    return float(poll_s)


def checked_name(name: object, what: str) -> str:
    """A study's or a search's name, as its trials' trainers carry it (``NAME#N``):
    text, not blank, printable (a newline split the trainer's arguments), without '#'."""
    if not isinstance(name, str) or not name.strip() or not name.isprintable() or "#" in name:
        raise CampaignError(f"{what} {name!r}: give a printable name without '#'")
    return name


@dataclass(frozen=True)
class TrialSpec:
    """How every trial of the campaign runs: ``script`` with ``args``, then the trial's
    parameters as options, on ``n_min``..``n_max`` nodes (slots)."""

    script: Path
    args: tuple[str, ...] = ()
    backend: str = "torchrun"
    n_min: int = 1
    n_max: int = 1
    work_samples: float = math.inf  # until the trial's own stop
    rescale_up_s: float | None = None
    rescale_down_s: float | None = None


@dataclass
class Tally:
    """The campaign's trials by end, as the study holds them."""

    running: int = 0
    complete: int = 0
    pruned: int = 0
    failed: int = 0
    stopping: int = 0  # trainers of ended (pruned) trials the daemon has yet to stop
    trainers: dict[int, str] = field(default_factory=dict)  # trial number -> trainer


def token(study: optuna.Study, number: int) -> str:
    """The name a trial's trainer carries (``--trial``): unique within the study."""
    return f"{study.study_name}#{number}"


def trainers_by_trial(store: Store) -> dict[str, TrainerRow]:
    """Every trainer in the store that runs a trial, by its ``--trial`` name."""
    out: dict[str, TrainerRow] = {}
    for row in store.trainers():
        args = list(row.args)
        for i, a in enumerate(args[:-1]):
            if a == TRIAL_OPTION:
                out.setdefault(args[i + 1], row)
    return out


class DaemonWatch:
    """Says once when the daemon of a store is gone, and once when it is back. A campaign
    waits for it meanwhile, rightly (its running trainers train on; queued ones start
    when it is back), but a wait that says nothing looks like a hang."""

    def __init__(self, store: Store) -> None:
        self.state_dir = store.path.parent
        self.gone = False

    def check(self) -> None:
        running = daemon_running(self.state_dir) is not None
        if not running and not self.gone:
            log.warning(
                "no bftrainer daemon is running for %s: the trials wait for it (trainers "
                "that run train on); start it again with `bftrainer daemon`",
                self.state_dir,
            )
        elif running and self.gone:
            log.info("the daemon of %s is back", self.state_dir)
        self.gone = not running


def room(store: Store) -> int:
    """Nodes (slots) the pool has beyond every unfinished trainer's minimum: the pool the
    daemon last read (``status``'s), less nodes left out, times its slots per node."""
    pool = store.get_setting("pool", {"nodes": {}})
    nodes = sum(1 for info in pool["nodes"].values() if not info.get("left_out"))
    slots = store.get_setting("slots_per_node", 1)
    per_node = slots if isinstance(slots, int) and slots >= 1 else 1
    demand = sum(t.n_min for t in store.trainers() if not t.finished)
    return nodes * per_node - demand


@contextmanager
def study_lock(state_dir: Path, study: optuna.Study) -> Iterator[None]:
    """One campaign per study and state directory: a second is refused in one line."""
    key = hashlib.sha256(study.study_name.encode()).hexdigest()[:16]
    path = state_dir / f"hpo-{key}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CampaignError(
                f"study {study.study_name!r}: another campaign runs it on {state_dir} ({path})"
            ) from None
        yield
    finally:
        os.close(fd)


def checked_trials(spec: TrialSpec, max_parallel: int | None) -> TrialSpec:
    """``spec`` with its script's whole path (the daemon starts it from its own
    directory), or ``CampaignError`` naming what a campaign or a search cannot run."""
    if max_parallel is not None and max_parallel < 1:
        raise CampaignError(f"max_parallel {max_parallel}: must be at least 1")
    if not 1 <= spec.n_min <= spec.n_max:
        raise CampaignError(f"trial nodes {spec.n_min}..{spec.n_max}: need 1 <= min <= max")
    script = Path(spec.script).expanduser().absolute()
    if not script.is_file():
        raise CampaignError(f"trial script {script}: no such file")
    return replace(spec, script=script)


def submit_trial(store: Store, spec: TrialSpec, params: list[str], name: str) -> str:
    """Queue one trial as a trainer of ``spec``: the script's own options, then the
    trial's parameters (``params``, as options), then ``--trial NAME``; its id."""
    up_s, down_s = DEFAULT_RESCALE_S[spec.backend]
    return store.submit(
        spec.script,
        [*spec.args, *params, TRIAL_OPTION, name],
        backend=spec.backend,
        n_min=spec.n_min,
        n_max=spec.n_max,
        work_samples=spec.work_samples,
        rescale_up_s=up_s if spec.rescale_up_s is None else spec.rescale_up_s,
        rescale_down_s=down_s if spec.rescale_down_s is None else spec.rescale_down_s,
    )


class Campaign:
    """``n_trials`` trials of ``study`` over ``space``, each a trainer of ``spec``, on the
    daemon of ``store``; at most ``max_parallel`` at once (None: as the pool allows)."""

    def __init__(
        self,
        study: optuna.Study,
        space: Mapping[str, BaseDistribution],
        spec: TrialSpec,
        store: Store,
        n_trials: int,
        max_parallel: int | None = None,
    ) -> None:
        if n_trials < 1:
            raise CampaignError(f"n_trials {n_trials}: must be at least 1")
        checked_name(study.study_name, "study")
        spec = checked_trials(spec, max_parallel)
        if not space:
            raise CampaignError("the search space is empty: give at least one parameter")
        if len(study.directions) != 1:
            raise CampaignError(
                f"study {study.study_name!r} has {len(study.directions)} objectives: a trial "
                "reports one value (runtime.report), so only single-objective studies run"
            )
        self.study, self.space, self.spec, self.store = study, dict(space), spec, store
        self.n_trials, self.max_parallel = n_trials, max_parallel
        self._offsets: dict[int, int] = {}  # trial number -> metrics.jsonl bytes read

    # -- one step ------------------------------------------------------------------
    def step(self) -> Tally:
        """Follow every running trial, then start new ones while there is room."""
        trials = self.study.get_trials(deepcopy=False)
        rows = trainers_by_trial(self.store)
        for ft in trials:
            if ft.state == TrialState.RUNNING:
                self._follow(ft, rows)
        trials = self.study.get_trials(deepcopy=False)
        asked = len(trials)
        active = sum(t.state == TrialState.RUNNING for t in trials)
        while asked < self.n_trials and self._may_start(active):
            trial = self.study.ask(self.space)
            self._submit(self.study._storage.get_trial(trial._trial_id), trial)
            asked, active = asked + 1, active + 1
        return self.tally()

    def tally(self) -> Tally:
        out = Tally()
        rows = trainers_by_trial(self.store)
        for ft in self.study.get_trials(deepcopy=False):
            row = rows.get(token(self.study, ft.number))
            if ft.state.is_finished() and row is not None and not row.finished:
                out.stopping += 1
            if ft.state == TrialState.RUNNING:
                out.running += 1
            elif ft.state == TrialState.COMPLETE:
                out.complete += 1
            elif ft.state == TrialState.PRUNED:
                out.pruned += 1
            elif ft.state == TrialState.FAIL:
                out.failed += 1
            if ATTR_TRAINER in ft.user_attrs:
                out.trainers[ft.number] = str(ft.user_attrs[ATTR_TRAINER])
        return out

    def done(self, tally: Tally) -> bool:
        asked = tally.running + tally.complete + tally.pruned + tally.failed
        return asked >= self.n_trials and tally.running == 0 and tally.stopping == 0

    def run(self, poll_s: float = 5.0, timeout_s: float | None = None) -> Tally:
        """Step every ``poll_s`` until every trial has ended and the daemon has stopped
        every trainer of a pruned one (or ``timeout_s`` passed)."""
        poll_s = checked_poll_s(poll_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        watch = DaemonWatch(self.store)
        busy_since: float | None = None
        while True:
            watch.check()
            try:
                tally = self.step()
            except STORAGE_ERRORS as exc:
                if not storage_busy(exc):
                    raise CampaignError(f"the study's storage failed: {first_line(exc)}") from None
                # Another program reading or writing the study (a dashboard, a script):
                # SQLite's lock outlasted its wait. A step is redone from what is stored,
                # as after a kill, so the campaign tries again at the next poll.
                now = time.monotonic()
                if busy_since is None:
                    busy_since = now
                    log.warning("the study's storage is busy (%s): trying again", first_line(exc))
                elif now - busy_since > STORAGE_BUSY_MAX_S:
                    raise CampaignError(
                        f"the study's storage stayed busy for {STORAGE_BUSY_MAX_S:g} s: "
                        f"{first_line(exc)}"
                    ) from None
                time.sleep(poll_s)
                continue
            busy_since = None
            if self.done(tally):
                return tally
            if deadline is not None and time.monotonic() > deadline:
                raise CampaignError(f"timed out after {timeout_s:g} s with {tally}")
            time.sleep(poll_s)

    # -- starting a trial ------------------------------------------------------------
    def _may_start(self, active: int) -> bool:
        if self.max_parallel is not None and active >= self.max_parallel:
            return False
        return room(self.store) >= self.spec.n_min

    def _submit(self, ft: FrozenTrial, trial: optuna.Trial | None = None) -> str:
        """Queue the trial's trainer, then record its id in the trial. A trainer the
        store already has for it (a campaign killed between the two) is recorded, not
        queued again."""
        name = token(self.study, ft.number)
        existing = trainers_by_trial(self.store).get(name)
        if existing is not None:
            trainer_id = existing.id
        else:
            trainer_id = submit_trial(self.store, self.spec, as_args(ft.params), name)
            log.info("trial %d -> trainer %s: %s", ft.number, trainer_id, ft.params)
        trial = trial or optuna.trial.Trial(self.study, ft._trial_id)
        trial.set_user_attr(ATTR_TRAINER, trainer_id)
        return trainer_id

    # -- following a trial -------------------------------------------------------------
    def _follow(self, ft: FrozenTrial, rows: Mapping[str, TrainerRow]) -> None:
        row = rows.get(token(self.study, ft.number))
        if row is None:  # asked but never queued: the campaign was killed between
            foreign = sorted(set(ft.params) - set(self.space))
            if foreign:
                self._fail(ft, f"its parameters {foreign} are not in this campaign's space")
                return
            trial = optuna.trial.Trial(self.study, ft._trial_id)
            missing = [name for name in self.space if name not in ft.params]
            for name in missing:  # killed mid-ask: the sampler draws what was not recorded
                trial._suggest(name, self.space[name])
            if missing:
                log.info("trial %d: parameters %s drawn after a restart", ft.number, missing)
            self._submit(self.study._storage.get_trial(ft._trial_id), trial)
            return
        if ATTR_TRAINER not in ft.user_attrs:
            optuna.trial.Trial(self.study, ft._trial_id).set_user_attr(ATTR_TRAINER, row.id)
        # The row is read before the reports: a trainer recorded as ended has written
        # all of them (rank 0 writes its last report before result.json).
        row = self.store.trainer(row.id)
        if ATTR_PRUNED in ft.user_attrs:
            self._pruned(ft, row)  # decided at an earlier step, or before a restart
        elif not self._forward(ft, row):
            self._ended(ft, row)

    def _forward(self, ft: FrozenTrial, row: TrainerRow) -> bool:
        """Report the trainer's new values to the study; True when its pruner says stop
        (the trainer is then cancelled: its nodes return at the daemon's next step)."""
        if row.trainer_dir is None:
            return False
        reports, offset = channel.read_reports(
            Path(row.trainer_dir), self._offsets.get(ft.number, 0)
        )
        seen = set(ft.intermediate_values)
        new = [r for r in reports if r["samples_done"] not in seen]
        trial = optuna.trial.Trial(self.study, ft._trial_id)
        for r in new:
            if r["samples_done"] not in seen:
                trial.report(float(r["value"]), int(r["samples_done"]))
                seen.add(r["samples_done"])
        # Only once the study holds them: a busy storage raises above, and the step that
        # is redone reads these reports again (those told already are in ``seen``).
        self._offsets[ft.number] = offset
        if not new:
            return False
        if row.finished:
            return False
        if not trial.should_prune():
            self._mark(ft, row)
            return False
        trial.set_user_attr(ATTR_PRUNED, {"samples": max(seen), "time_s": time.time()})
        self.store.request_cancel(row.id)
        log.info(
            "trial %d pruned at %d samples: trainer %s cancelled", ft.number, max(seen), row.id
        )
        return True

    def _mark(self, ft: FrozenTrial, row: TrainerRow) -> None:
        """Store the trial's promise with its trainer, the rungs its pruner passed it
        (bftrainer/common/promise.py): the daemon's milp weighs it if told to."""
        rungs = rungs_passed(self.study._storage.get_trial_system_attrs(ft._trial_id))
        if rungs != row.rungs:
            self.store.set_rungs(row.id, rungs)
            log.info("trial %d passed %d rung(s): marked on trainer %s", ft.number, rungs, row.id)

    def _pruned(self, ft: FrozenTrial, row: TrainerRow) -> None:
        """A pruned trial ends with its trainer: PRUNED once the daemon has cancelled it
        (asked again after a restart: it is idempotent), and what the trainer's end says
        if it ended otherwise first (its work was done before the cancel reached it)."""
        if not row.finished:
            self.store.request_cancel(row.id)
        elif row.state == "cancelled":
            self.study.tell(ft.number, state=TrialState.PRUNED, skip_if_finished=True)
        else:
            self._forward(ft, row)
            self._ended(self.study._storage.get_trial(ft._trial_id), row)

    def _ended(self, ft: FrozenTrial, row: TrainerRow) -> None:
        """Tell the study a trainer's end: done is COMPLETE with its last report."""
        if row.state == "done":
            ft = self.study._storage.get_trial(ft._trial_id)
            if not ft.intermediate_values:
                self._fail(ft, f"trainer {row.id} ended without a report (runtime.report)")
                return
            value = ft.intermediate_values[max(ft.intermediate_values)]
            self.study.tell(ft.number, value, skip_if_finished=True)
            log.info("trial %d complete: %g (trainer %s)", ft.number, value, row.id)
        elif row.state == "failed":
            self._fail(ft, f"trainer {row.id} failed: {row.reason}")
        elif row.state == "cancelled":
            self._fail(ft, f"trainer {row.id} was cancelled outside the campaign")

    def _fail(self, ft: FrozenTrial, why: str) -> None:
        trial = optuna.trial.Trial(self.study, ft._trial_id)
        trial.set_user_attr(ATTR_END, why)
        self.study.tell(ft.number, state=TrialState.FAIL, skip_if_finished=True)
        log.warning("trial %d failed: %s", ft.number, why)


def summary(study: optuna.Study, tally: Tally) -> dict[str, Any]:
    """What ``bftrainer hpo`` prints at the end: counts, and the best trial if any."""
    out: dict[str, Any] = {
        "study": study.study_name,
        "complete": tally.complete,
        "pruned": tally.pruned,
        "failed": tally.failed,
        "running": tally.running,
        "best": None,
    }
    if tally.complete:
        best = study.best_trial
        out["best"] = {
            "number": best.number,
            "value": best.value,
            "params": best.params,
            "trainer": best.user_attrs.get(ATTR_TRAINER),
        }
    return out
