"""The runtime's options, as a trainer script's command line gives them.

:func:`add_runtime_args` adds them to the script's own parser; :class:`RuntimeOptions`
holds them with their defaults in one place.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from bftrainer.trainers.goodput import DEFAULT_SWITCH_GAIN, BatchLimits
from bftrainer.trainers.lr_scaling import RULES


class RuntimeConfigError(ValueError):
    """Runtime options that cannot work together (names the option and value)."""


@dataclass(frozen=True)
class RuntimeOptions:
    """The runtime's options (``add_runtime_args``), with their defaults."""

    work_samples: int | None = None
    work_epochs: int | None = None
    commit_every_steps: int | None = None  # by time only unless given
    commit_every_s: float = 10.0
    report_every_s: float = 10.0
    base_batch: int = 64
    max_batch: int = 1024
    max_local_batch: int = 256
    min_local_batch: int = 1
    max_accum_steps: int = 15
    lr_rule: str = "adascale"
    switch_gain: float = DEFAULT_SWITCH_GAIN
    retune: bool = True
    checkpoint: bool = True  # False: commits stay in memory (a restart starts afresh)
    data_seed: int = 0
    trainer_dir: str | None = None
    trainer_id: str | None = None
    trial: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RuntimeOptions:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in vars(args).items() if k in names})

    def limits(self) -> BatchLimits:
        return BatchLimits(
            base_batch_size=self.base_batch,
            max_batch_size=self.max_batch,
            max_local_bsz=self.max_local_batch,
            min_local_bsz=self.min_local_batch,
            max_accum_steps=self.max_accum_steps,
        )


def base_config(lim: BatchLimits, replicas: int) -> tuple[int, int]:
    """(local batch, accumulation) reaching M0 with the fewest micro-steps (what a trainer
    runs before its agent has a model); ValueError naming the limits when none fits."""
    per_replica = math.ceil(lim.base_batch_size / replicas)
    accum = math.ceil(per_replica / lim.max_local_bsz) - 1
    local = max(lim.min_local_bsz, math.ceil(per_replica / (accum + 1)))
    if accum > lim.max_accum_steps or replicas * local * (accum + 1) > lim.max_batch_size:
        raise ValueError(
            f"no batch fits {replicas} replica(s) with the limits {lim}: raise "
            "--max-batch, --max-local-batch or --max-accum-steps"
        )
    return local, accum


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
    """Add the runtime's options to a trainer script's parser."""
    g = parser.add_argument_group("bftrainer runtime")
    work = g.add_mutually_exclusive_group()
    work.add_argument("--work-samples", type=int, help="train on exactly N samples, then stop")
    work.add_argument("--work-epochs", type=int, help="train exactly E epochs (default 1)")
    d = RuntimeOptions()
    g.add_argument("--commit-every-steps", type=int, default=d.commit_every_steps)
    g.add_argument("--commit-every-s", type=float, default=d.commit_every_s)
    g.add_argument("--report-every-s", type=float, default=d.report_every_s)
    g.add_argument("--base-batch", type=int, default=d.base_batch, help="M0, the tuned batch")
    g.add_argument("--max-batch", type=int, default=d.max_batch)
    g.add_argument("--max-local-batch", type=int, default=d.max_local_batch)
    g.add_argument("--min-local-batch", type=int, default=d.min_local_batch)
    g.add_argument("--max-accum-steps", type=int, default=d.max_accum_steps)
    g.add_argument("--lr-rule", choices=sorted(RULES), default=d.lr_rule)
    g.add_argument(
        "--switch-gain",
        type=float,
        default=d.switch_gain,
        help="between rescales, move to the agent's best batch when it promises this "
        "much more goodput (a fraction; default %(default)s)",
    )
    g.add_argument(
        "--no-retune",
        dest="retune",
        action="store_false",
        help="choose the batch at resets only, never between them",
    )
    g.add_argument(
        "--no-checkpoint",
        dest="checkpoint",
        action="store_false",
        help="write no checkpoint.pt (benchmarks; a restart then starts from scratch)",
    )
    g.add_argument("--data-seed", type=int, default=d.data_seed, help="sampler order seed")
    g.add_argument(
        "--trainer-dir",
        default=os.environ.get("BFTRAINER_TRAINER_DIR"),
        help="trainer directory (default $BFTRAINER_TRAINER_DIR, else ./bftrainer-run-<script>)",
    )
    g.add_argument("--trainer-id", default=os.environ.get("BFTRAINER_TRAINER_ID"))
    g.add_argument(
        "--trial",
        help="the search trial this trainer runs (set by bftrainer hpo; kept in its reports)",
    )


def parse_runtime_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """``parser.parse_args`` with the runtime's options added."""
    add_runtime_args(parser)
    return parser.parse_args(argv)
