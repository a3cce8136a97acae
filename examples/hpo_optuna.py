"""An Optuna study of examples/hpo_digits.py, trial by trial on a daemon's pool.

The Python way in (the shell's is `bftrainer hpo`, docs/hpo.md): a study with TPE and
ASHA (Optuna's successive halving, asynchronous), a search space, and a ``Campaign``
that submits each trial as a trainer when the pool can run one more, prunes the losing
ones through the study's pruner, and tells the study each end. With a daemon running:

    python examples/hpo_optuna.py --state-dir ~/.local/state/bftrainer --n-trials 24

Killed and run again with the same arguments, it goes on where it was.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import optuna
from optuna.distributions import FloatDistribution, IntDistribution

from bftrainer.hpo import Campaign, TrialSpec, study_lock, summary
from bftrainer.state import Store, resolve_state_dir

TRIAL = Path(__file__).with_name("hpo_digits.py")
EPOCH = 1437  # the digits' training fifths (hpo_digits.digits)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--state-dir", type=Path, help="the daemon's (default: as bftrainer)")
    parser.add_argument("--study", default="digits")
    parser.add_argument("--n-trials", type=int, default=24)
    parser.add_argument("--epochs", type=int, default=10, help="each trial's work if not pruned")
    parser.add_argument("--max-parallel", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    state_dir = resolve_state_dir(args.state_dir)
    study = optuna.create_study(
        storage=f"sqlite:///{state_dir / 'hpo.db'}",
        study_name=args.study,
        direction="minimize",  # the validation loss hpo_digits reports
        sampler=optuna.samplers.TPESampler(seed=args.seed),
        # Resources are samples seen: the first rung after one epoch, then x3.
        pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=EPOCH, reduction_factor=3),
        load_if_exists=True,
    )
    space = {
        "lr": FloatDistribution(1e-3, 1.0, log=True),
        "hidden": IntDistribution(4, 128, log=True),
    }
    # A fixed batch (64): trials compare at the same samples whatever their node count.
    spec = TrialSpec(
        TRIAL,
        ("--max-batch", "64", "--commit-every-steps", "20"),
        backend="torchrun",
        n_min=1,
        n_max=2,
        work_samples=args.epochs * EPOCH,
    )
    with Store.open(state_dir, create=False) as store, study_lock(state_dir, study):
        tally = Campaign(study, space, spec, store, args.n_trials, args.max_parallel).run()
    print(json.dumps(summary(study, tally), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
