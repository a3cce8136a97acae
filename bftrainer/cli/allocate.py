"""``bftrainer allocate``: solve one allocation problem given as JSON."""

from __future__ import annotations

import json
from typing import Any, TextIO

import click

from bftrainer.cli import UsageError
from bftrainer.cli.params import InputTextFile, Number
from bftrainer.common import strict_json
from bftrainer.milp import (
    DEFAULT_TIME_LIMIT_S,
    FORMULATIONS,
    SOLVERS,
    Allocation,
    ProblemError,
    allocate,
    problem_from_dict,
)
from bftrainer.milp.solvers import SolverError


@click.command("allocate")
@click.argument("problem_file", metavar="PROBLEM.json", type=InputTextFile())
@click.option("--formulation", type=click.Choice(FORMULATIONS), default="count", show_default=True)
@click.option("--solver", type=click.Choice(SOLVERS), default="highs", show_default=True)
@click.option(
    "--time-limit",
    "time_limit_s",
    type=Number(min=0.01),
    default=DEFAULT_TIME_LIMIT_S,
    show_default=True,
    help="Solver limit in seconds; on timeout, the better of incumbent and current map.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def allocate_cmd(
    problem_file: TextIO,
    formulation: str,
    solver: str,
    time_limit_s: float,
    as_json: bool,
) -> None:
    """Decide the node set of every trainer for the pool in PROBLEM.json ('-' for stdin).

    The input format is in docs/allocator.md.
    """
    name = problem_file.name
    try:
        data = json.load(problem_file, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise UsageError(f"{name}: not valid JSON: {e}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{name}: not UTF-8 text ({e.reason}); expected JSON") from None
    except RecursionError:
        raise UsageError(f"{name}: JSON nested too deeply to be a problem") from None
    except ValueError as e:  # e.g. an integer of more than 4,300 digits
        raise UsageError(f"{name}: not a usable JSON value: {e}") from None
    try:
        problem = problem_from_dict(data)
    except ProblemError as e:
        raise UsageError(f"{name}: {e}") from None
    try:
        result = allocate(
            problem, formulation=formulation, solver=solver, time_limit_s=time_limit_s
        )
    except SolverError as e:
        raise click.ClickException(str(e)) from None
    except ProblemError as e:  # what only solving finds (a fair share's divisor)
        raise UsageError(f"{name}: {e}") from None
    if as_json:
        click.echo(strict_json.dumps(result.to_json(), indent=2))
    else:
        click.echo(format_table(result, data))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once: with a key given twice the last one
    won without a word (a second "pool" replaced the first), as a trace's header that
    repeats a column once did."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice in one object")
        out[key] = value
    return out


def format_table(result: Allocation, data: Any) -> str:
    slots = isinstance(data, dict) and data.get("slots_per_node", 1) != 1
    rows = [
        ("trainer", "nodes (once per slot)", "slots") if slots else ("trainer", "nodes", "count")
    ]
    for tid, nodes in result.nodes.items():
        shown = ",".join(nodes) if len(nodes) <= 8 else ",".join(nodes[:8]) + ",..."
        rows.append((tid, shown or "-", str(len(nodes))))
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, width, strict=True)).rstrip() for r in rows]
    bound = "-" if result.bound is None else f"{result.bound:.6g}"
    lines.append("")
    lines.append(
        f"objective {result.objective:.6g}  bound {bound}  status {result.status}  "
        f"{result.formulation}/{result.solver}  {result.solve_s * 1000:.1f} ms"
    )
    if result.waiting:
        lines.append(f"waiting (over max_trainers): {', '.join(result.waiting)}")
    return "\n".join(lines)
