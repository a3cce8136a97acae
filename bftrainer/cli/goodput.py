"""``bftrainer goodput``: check the Pollux step-time model by hand."""

from __future__ import annotations

from pathlib import Path

import click

from bftrainer.cli import UsageError
from bftrainer.cli.params import InputFile
from bftrainer.common import strict_json
from bftrainer.trainers.throughput import (
    FitError,
    ObservationFileError,
    fit_throughput,
    read_observations_csv,
)


@click.group("goodput")
def goodput() -> None:
    """Pollux-style goodput model: step-time fit, efficiency, best batch size."""


@goodput.command("fit")
@click.argument("obs_file", metavar="OBS.csv", type=InputFile(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def fit_cmd(obs_file: Path, as_json: bool) -> None:
    """Fit the step-time model to observed steps and show how well it reproduces them.

    OBS.csv has the columns nodes,local_bsz,accum_steps,step_time_s (one row per step
    or per mean of steps) and optionally replicas (default: one per node). The model
    and the output are described in docs/goodput.md.
    """
    try:
        observations = read_observations_csv(obs_file)
        model = fit_throughput(observations)
    except (ObservationFileError, FitError) as e:
        raise UsageError(str(e)) from None
    predicted = model.step_time_s(
        [o.nodes for o in observations],
        [o.replicas for o in observations],
        [o.local_bsz for o in observations],
        [o.accum_steps for o in observations],
    )
    if model.under_determined:
        click.echo(
            f"warning: under-determined fit: {model.distinct_configs} distinct "
            f"(nodes, replicas, local_bsz, accum_steps) observation(s) for "
            f"{model.free_params} fitted parameter(s), {7 - model.free_params} more fixed "
            "by assumption; the RMSLE says nothing about other configurations: observe "
            "more node counts and batch sizes",
            err=True,
        )
    if as_json:
        out = {
            "params": model.params.to_dict(),
            "rmsle": model.rmsle,
            "predicted_step_time_s": [float(t) for t in predicted],
            "free_params": model.free_params,
            "distinct_configs": model.distinct_configs,
            "under_determined": model.under_determined,
        }
        click.echo(strict_json.dumps(out, indent=2))
        return
    click.echo(f"fitted {len(observations)} observations from {obs_file}")
    for name, value in model.params.to_dict().items():
        click.echo(f"  {name:<14} {value:.6g}")
    rel = [
        abs(p - o.step_time_s) / o.step_time_s for p, o in zip(predicted, observations, strict=True)
    ]
    click.echo(f"RMSLE {model.rmsle:.4f}, mean relative error {100 * sum(rel) / len(rel):.1f}%")
    click.echo(
        f"{'nodes':>5} {'replicas':>8} {'local_bsz':>9} {'accum':>5} "
        f"{'step_time_s':>12} {'predicted_s':>12} {'error':>7}"
    )
    for o, p, r in zip(observations, predicted, rel, strict=True):
        sign = "+" if p >= o.step_time_s else "-"
        click.echo(
            f"{o.nodes:>5} {o.replicas:>8} {o.local_bsz:>9} {o.accum_steps:>5} "
            f"{o.step_time_s:>12.6g} {float(p):>12.6g} {sign}{100 * r:>5.1f}%"
        )
