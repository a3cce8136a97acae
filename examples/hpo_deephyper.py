"""A DeepHyper search of examples/hpo_digits.py, trial by trial on a daemon's pool.

DeepHyper's own CBO search (its acquisition optimized by sampling) and successive-
halving stopper, unchanged; only the evaluator is bftrainer's
(``bftrainer.hpo.evaluator.TrainerEvaluator``): each configuration runs as a trainer
when the pool can run one more, the stopper hears the validation loss the trial reports
at its commits and cancels the losers. With a daemon running:

    python examples/hpo_deephyper.py --state-dir ~/.local/state/bftrainer --max-evals 24

Options it does not know go to every trial script (``--step-delay-s 0.03``). Killed and
run again with the same arguments, it goes on where it was: DeepHyper reloads the
results it wrote (``LOG_DIR/results.csv``) and the evaluator adopts the trials that run.
Prints one JSON line at the end: counts and the best configuration.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd
from deephyper.hpo import CBO, HpProblem
from deephyper.stopper import SuccessiveHalvingStopper

from bftrainer.hpo import CampaignError, TrialSpec
from bftrainer.hpo.evaluator import TrainerEvaluator
from bftrainer.state import Store, resolve_state_dir

TRIAL = Path(__file__).with_name("hpo_digits.py")
BATCH, EVERY = 64, 20  # a fixed batch, a report every 20 steps: one budget unit, 1,280 samples


def summary(name: str, results: pd.DataFrame) -> dict[str, Any]:
    ends = results["m:trainer_end"].astype(str)
    pruned = results["m:pruned"].astype(str) == "True"
    done = results[(ends == "done") & ~pruned]
    out: dict[str, Any] = {
        "search": name,
        "complete": len(done),
        "pruned": int(pruned.sum()),
        "failed": int(((ends != "done") & ~pruned).sum()),
        "best": None,
    }
    if len(done):
        best = done.loc[pd.to_numeric(done["objective"]).idxmax()]
        out["best"] = {
            "loss": -float(best["objective"]),
            "lr": float(best["p:lr"]),
            "hidden": int(best["p:hidden"]),
            "trainer": str(best["m:trainer"]),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--state-dir", type=Path, help="the daemon's (default: as bftrainer)")
    parser.add_argument("--name", default="digits-dh", help="the search's trainers' name")
    parser.add_argument("--log-dir", type=Path, help="default: STATE_DIR/deephyper-NAME")
    parser.add_argument("--max-evals", type=int, default=24)
    parser.add_argument("--work-samples", type=int, default=14370, help="a trial, unstopped")
    parser.add_argument("--max-parallel", type=int, default=None)
    parser.add_argument("--max-nodes", dest="n_max", metavar="MAX_NODES", type=int, default=2)
    parser.add_argument("--poll-interval", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    args, trial_args = parser.parse_known_args(argv)
    state_dir = resolve_state_dir(args.state_dir)
    log_dir = args.log_dir or state_dir / f"deephyper-{args.name}"
    problem = HpProblem()
    problem.add_hyperparameter((1e-3, 1.0, "log-uniform"), "lr")
    problem.add_hyperparameter((4, 64, "log-uniform"), "hidden")
    unit = BATCH * EVERY
    # Budgets in reports (1,280 samples): rungs at 1 and 3 reports, the top third goes on.
    stopper = SuccessiveHalvingStopper(
        max_steps=math.ceil(args.work_samples / unit), min_steps=1, reduction_factor=3
    )
    spec = TrialSpec(
        TRIAL,
        ("--max-batch", str(BATCH), "--commit-every-steps", str(EVERY), *trial_args),
        n_max=args.n_max,
        work_samples=args.work_samples,
    )
    told = len(pd.read_csv(log_dir / "results.csv")) if (log_dir / "results.csv").exists() else 0
    try:
        with Store.open(state_dir, create=False) as store:
            evaluator = TrainerEvaluator(
                spec,
                store,
                args.name,
                budget_samples=unit,
                max_parallel=args.max_parallel,
                poll_s=args.poll_interval,
            )
            search = CBO(
                problem,
                # Seeded past what it reloads: the same seed again would propose the first
                # configurations once more (as Optuna's did: bftrainer.cli.hpo.resumed_sampler).
                random_state=args.seed + told,
                log_dir=str(log_dir),
                stopper=stopper,
                checkpoint_restart=True,  # a second run goes on from results.csv
                # The surrogate's best point among sampled ones: DeepHyper's default genetic
                # optimizer took 1.6 s of CPU an ask and tell on this 2-parameter space,
                # sampling 0.13 s (12 of each: 19.4 s against 1.6 s), on the login node.
                acq_optimizer="sampling",
            )
            # DeepHyper counts max_evals on top of the results it reloads.
            results = search.search(evaluator, max_evals=max(1, args.max_evals - told))
    except CampaignError as exc:  # bad input, as bftrainer hpo says it: one line
        parser.exit(2, f"hpo_deephyper: {exc}\n")
    print(json.dumps(summary(args.name, results), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
