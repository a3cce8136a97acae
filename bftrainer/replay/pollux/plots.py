"""Plots of Pollux replays: statistical efficiency over time, and the JCT distribution."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bftrainer.common.plotting import agg_pyplot
from bftrainer.loop import TrainerState

if TYPE_CHECKING:
    from bftrainer.replay.pollux.trainer import PolluxReport


def plot_efficiency(runs: Sequence[tuple[str, PolluxReport]], path: Path) -> None:
    """Statistical efficiency over time: the mean over running trainers, and the share of
    processed samples that counted (samples-weighted), one line per run."""
    plt = agg_pyplot()

    fig, axes = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    for label, rep in runs:
        hours = [r["hours"] for r in rep.series]
        for ax, key in zip(axes, ("efficiency_mean", "efficiency_samples"), strict=True):
            values = [math.nan if r[key] is None else r[key] for r in rep.series]
            ax.plot(hours, values, lw=1.2, label=label or None)
    axes[0].set_ylabel("mean efficiency\nof running trainers")
    axes[1].set_ylabel("useful share\nof samples")
    axes[1].set_xlabel("hours since the replay started")
    for ax in axes:
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    if any(label for label, _ in runs):
        axes[0].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_completion(runs: Sequence[tuple[str, Sequence[TrainerState]]], path: Path) -> None:
    """CDF of job completion times (hours), one line per run."""
    plt = agg_pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, trainers in runs:
        jct = sorted(
            (t.finished_s - t.job.submit_s) / 3600 for t in trainers if t.finished_s is not None
        )
        if jct:
            frac = np.arange(1, len(jct) + 1) / len(trainers)
            ax.step(jct, frac, where="post", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs completed")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
