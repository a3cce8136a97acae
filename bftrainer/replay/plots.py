"""PNG plots of replays (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bftrainer.common.plotting import agg_pyplot
from bftrainer.replay.run import ReplayResult, t_fwd_label


def _label(r: ReplayResult) -> str:
    s = r.summary
    return f"milp (T_fwd={t_fwd_label(s)} s)" if s["policy"] == "milp" else s["policy"]


def plot_windows(results: Sequence[ReplayResult], path: Path) -> None:
    """U per window for each policy (the paper's Fig. 10)."""
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for r in results:
        hours = [i * r.config.window_s / 3600 for i in range(len(r.windows))]
        u = [100 * w["utilization_efficiency"] for w in r.windows]
        ax.plot(hours, u, marker="o", ms=3, label=_label(r))
    ax.set_xlabel("hours since the replay started")
    ax.set_ylabel(f"U per {results[0].config.window_s / 3600:g} h (%)")
    ax.set_ylim(0, 105)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_costs(results: Sequence[ReplayResult], path: Path) -> None:
    """Rescale and preemption costs per policy, in samples."""
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    labels = [_label(r) for r in results]
    rescale = [r.summary["rescale_cost_samples"] for r in results]
    preempt = [r.summary["preemption_cost_samples"] for r in results]
    ax.bar(labels, rescale, label="rescale")
    ax.bar(labels, preempt, bottom=rescale, label="preemption")
    ax.set_ylabel("samples lost")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_sweep(results: Sequence[ReplayResult], path: Path) -> None:
    """U against T_fwd (the paper's Fig. 9)."""
    fixed = [r for r in results if not isinstance(r.summary["t_fwd"], str)]
    pts = sorted((r.summary["t_fwd"], 100 * r.summary["utilization_efficiency"]) for r in fixed)
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
    for r in results:  # auto: a line at its U, across the fixed values
        if isinstance(r.summary["t_fwd"], str):
            u = 100 * r.summary["utilization_efficiency"]
            ax.axhline(u, ls="--", color="gray", label=f"T_fwd={t_fwd_label(r.summary)}")
            ax.legend(fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("T_fwd (s)")
    ax.set_ylabel("U (%)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
