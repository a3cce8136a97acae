"""``bftrainer hpo``: an Optuna study whose trials run as trainers on the daemon's pool.

The study lives in ``--storage`` (default: SQLite in the state directory), the trials'
trainers in the daemon's store; the command can be killed and run again with the same
arguments, and goes on where it was (docs/hpo.md).
"""

from __future__ import annotations

import importlib.util
import logging
import math
from pathlib import Path
from typing import Any

import click

from bftrainer.cli import UsageError
from bftrainer.cli.options import state_dir_option
from bftrainer.cli.params import NODES, SAMPLES, SEED, Number, file_to_read_error
from bftrainer.cli.store_access import open_store
from bftrainer.common import strict_json
from bftrainer.state import BACKENDS, resolve_state_dir

log = logging.getLogger(__name__)

PRUNERS = ("asha", "hyperband", "median", "none")
SAMPLERS = ("tpe", "random")
POLL_S = Number(min=0.1, max=3600.0)


def make_sampler(name: str, seed: int | None) -> Any:
    import optuna

    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def resumed_sampler(study: Any, name: str, seed: int | None) -> Any:
    """The sampler for a study that may already hold trials: a seeded sampler started
    again would draw its sequence from the start and propose the first trials'
    parameters once more (TPE's first trials are random), so a restarted campaign seeds
    it past the trials the study has."""
    asked = len(study.get_trials(deepcopy=False))
    return make_sampler(name, None if seed is None else seed + asked)


def make_pruner(name: str, min_resource: int | None, reduction_factor: int) -> Any:
    """``asha``: Optuna's successive halving, which is asynchronous (ASHA); resources are
    samples seen (the reports' key)."""
    import optuna

    resource: Any = "auto" if min_resource is None else min_resource
    if name == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=resource, reduction_factor=reduction_factor
        )
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=min_resource or 1, reduction_factor=reduction_factor
        )
    if name == "median":
        return optuna.pruners.MedianPruner()
    return optuna.pruners.NopPruner()


def _refuse_rung_options_without_rungs(pruner: str) -> None:
    """--min-resource and --reduction-factor shape asha's and hyperband's rungs; with
    another pruner they were accepted and ignored, so a typo'd campaign ran unpruned."""
    if pruner in ("asha", "hyperband"):
        return
    ctx = click.get_current_context()
    for name, flag in (
        ("min_resource", "--min-resource"),
        ("reduction_factor", "--reduction-factor"),
    ):
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            raise UsageError(f"{flag} means nothing without --pruner asha or hyperband")


def default_storage(state_dir: Path) -> Any:
    """SQLite beside the daemon's store, waiting up to 30 s (not SQLite's 5) for a lock
    another program holds (a dashboard reading the study, a script)."""
    import optuna  # a command's import: --help stays quick

    return optuna.storages.RDBStorage(
        f"sqlite:///{state_dir / 'hpo.db'}", engine_kwargs={"connect_args": {"timeout": 30}}
    )


@click.command(
    "hpo",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": True},
)
@click.argument("script", type=click.Path(path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--study", "study_name", required=True, help="The study's name in the storage.")
@click.option(
    "--storage",
    help="Optuna storage URL (default: sqlite:///STATE_DIR/hpo.db, beside the daemon's store).",
)
@click.option(
    "--param",
    "params",
    multiple=True,
    required=True,
    help="A parameter: NAME=float:LOW:HIGH[:log], NAME=int:LOW:HIGH[:log] or "
    "NAME=cat:A,B,...; the script gets it as --NAME VALUE. Repeat for each.",
)
@click.option("--n-trials", type=NODES, required=True, help="Trials in the study, all ends.")
@click.option("--direction", type=click.Choice(["minimize", "maximize"]), default="minimize")
@click.option("--sampler", type=click.Choice(SAMPLERS), default="tpe", show_default=True)
@click.option("--pruner", type=click.Choice(PRUNERS), default="asha", show_default=True)
@click.option(
    "--min-resource",
    type=SAMPLES,
    help="asha/hyperband: samples a trial trains before its first rung (default: asha "
    "guesses from the first complete trial).",
)
@click.option("--reduction-factor", type=Number(integer=True, min=2, max=100), default=3)
@click.option("--seed", type=SEED, help="The sampler's seed.")
@click.option("--min-nodes", "n_min", type=NODES, default=1, show_default=True)
@click.option("--max-nodes", "n_max", type=NODES, default=1, show_default=True)
@click.option("--work-samples", type=SAMPLES, help="Samples each trial trains if not pruned.")
@click.option("--backend", type=click.Choice(BACKENDS), default="torchrun", show_default=True)
@click.option("--max-parallel", type=NODES, help="Trials at once (default: as the pool allows).")
@click.option("--poll-interval", "poll_s", type=POLL_S, default=5.0, show_default=True)
@state_dir_option
def hpo_cmd(
    script: Path,
    args: tuple[str, ...],
    study_name: str,
    storage: str | None,
    params: tuple[str, ...],
    n_trials: int,
    direction: str,
    sampler: str,
    pruner: str,
    min_resource: int | None,
    reduction_factor: int,
    seed: int | None,
    n_min: int,
    n_max: int,
    work_samples: int | None,
    backend: str,
    max_parallel: int | None,
    poll_s: float,
    state_dir: Path | None,
) -> None:
    """Run an Optuna study whose trials are trainers on the daemon's pool, pruned early.

    Each trial runs SCRIPT [ARGS...] --NAME VALUE ... --trial STUDY#N; the script
    reports its metric with runtime.report (docs/hpo.md). Run it again with the same
    arguments after a kill: it goes on without losing or doubling a trial.
    """
    if importlib.util.find_spec("optuna") is None:
        raise UsageError("bftrainer hpo needs Optuna: pip install 'bftrainer[hpo]'")
    import optuna

    from bftrainer.hpo import (
        OPEN_ERRORS,
        Campaign,
        CampaignError,
        SpaceError,
        TrialSpec,
        checked_name,
        first_line,
        parse_space,
        study_lock,
        summary,
    )

    script = script.expanduser().absolute()
    problem = file_to_read_error(script)
    if problem is not None:
        raise UsageError(f"trial script {problem}")
    if n_max < n_min:
        raise UsageError(f"--max-nodes {n_max} is below --min-nodes {n_min}")
    _refuse_rung_options_without_rungs(pruner)
    if backend == "horovod" and importlib.util.find_spec("horovod") is None:
        raise UsageError("--backend horovod: Horovod is not installed here; use torchrun")
    try:
        space = parse_space(params)
        checked_name(study_name, "--study")
    except (SpaceError, CampaignError) as exc:
        raise UsageError(str(exc)) from None
    path = resolve_state_dir(state_dir)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with open_store(state_dir, need_daemon=True) as store:
        made_sampler = make_sampler(sampler, seed)
        made_pruner = make_pruner(pruner, min_resource, reduction_factor)
        try:
            study = optuna.create_study(
                storage=storage or default_storage(path),
                study_name=study_name,
                direction="maximize" if direction == "maximize" else "minimize",
                sampler=made_sampler,
                pruner=made_pruner,
                load_if_exists=True,
            )
        except OPEN_ERRORS as exc:  # a URL of no database, a driver not installed
            where = storage or f"{path}/hpo.db"
            raise UsageError(f"--study {study_name!r} in {where}: {first_line(exc)}") from None
        kept = study.direction.name.lower()
        if kept != direction:  # Optuna loads a study as it was, whatever was asked
            raise UsageError(
                f"--study {study_name!r} exists and {kept}s its value; give --direction "
                f"{kept} (or another --study)"
            )
        study.sampler = resumed_sampler(study, sampler, seed)
        work = math.inf if work_samples is None else work_samples
        spec = TrialSpec(script, args, backend, n_min, n_max, work)
        try:
            campaign = Campaign(study, space, spec, store, n_trials, max_parallel)
            with study_lock(path, study):
                tally = campaign.run(poll_s)
        except CampaignError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(strict_json.dumps(summary(study, tally), sort_keys=True))
