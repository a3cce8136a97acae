"""The simulated Pollux trainers' settings, state and results (plain data): the options
of the replay (``PolluxSimOptions``), what one trainer saw, fitted and achieved
(``SimTrainer``), and the report the replay adds to its outputs (``PolluxReport``).
A module of its own so that the driver (``pollux_sim.py``) and the curves its trainers
report (``pollux_curves.py``) share them, and the outputs read the report without the
driver."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bftrainer.replay.pollux.app import PolluxJob, PolluxSimError, SimApp
from bftrainer.trainers.agent import PolluxAgent, TrainerConfig
from bftrainer.trainers.goodput import DEFAULT_SWITCH_GAIN
from bftrainer.trainers.retune_cadence import RetuneCadence

DONE_RTOL = 1e-9
START_BATCHES = ("user", "pollux")


@dataclass(frozen=True)
class PolluxSimOptions:
    """How the simulated trainers behave; defaults in one place.

    ``noise``: sigma of the log-normal factor on observed step times (one draw per
    trainer and interval between events). ``report_interval_s``: a trainer reports new
    curves at least this often while it runs. ``refit_interval_s``: it refits its
    step-time model at most this often (Pollux's scheduling interval).
    ``series_bin_s``: width of the efficiency time series. ``start_batch``: what an
    adapting trainer runs before its first fit: ``"user"``, the user's batch per replica
    (what it keeps without adaptation), or ``"pollux"``, Pollux's smallest batch >= M0.
    ``gns_smoothing``: the agent's noise-scale smoothing per base-batch step. The driver
    feeds it exact statistics (the profile's, per epoch), so 0 (the latest) has no
    noise to average and no lag; the library's default for real, noisy estimates,
    0.999, lags a fast-growing noise scale several-fold (docs/goodput-replay.md).
    ``switch_gain``: between rescales, an adapting trainer moves to its model's best
    batch only when that promises this much more goodput than what it runs: the live
    runtime's rule and default (``goodput.retune_choice``), at the live runtime's
    cadence (``trainers/retune_cadence.py``: each pass over the data, counted in the
    samples it ran as the live sampler counts them, or every minute times its back-off),
    each decision charged
    ``retune_cost_s`` of training at the configuration it runs: what a decision costs the
    live runtime beyond the step-time refit, which the replay does not charge at reports
    either (a flush of the noise probe and a search on rank 0's host; docs/trainers.md).
    """

    batch_adapt: bool = True
    start_batch: str = "user"
    gns_smoothing: float = 0.0
    switch_gain: float = DEFAULT_SWITCH_GAIN
    noise: float = 0.05
    report_interval_s: float = 60.0
    refit_interval_s: float = 60.0
    retune_cost_s: float = 0.02
    series_bin_s: float = 3600.0
    seed: int = 0
    # S > 1: a trainer's nodes name a node once per slot (one replica each); its step
    # time is its placement's (placements.csv), and it reports packed and spread curves.
    slots_per_node: int = 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise) and self.noise >= 0):
            raise PolluxSimError(f"noise is {self.noise!r}, expected a finite number >= 0")
        if self.start_batch not in START_BATCHES:
            raise PolluxSimError(
                f"start_batch is {self.start_batch!r}, expected one of {', '.join(START_BATCHES)}"
            )
        if not (0.0 <= self.gns_smoothing < 1.0):
            raise PolluxSimError(f"gns_smoothing is {self.gns_smoothing!r}, expected 0 <= x < 1")
        if not (math.isfinite(self.switch_gain) and self.switch_gain >= 0):
            raise PolluxSimError(f"switch_gain is {self.switch_gain!r}, expected a number >= 0")
        if not (math.isfinite(self.retune_cost_s) and self.retune_cost_s >= 0):
            raise PolluxSimError(f"retune_cost_s is {self.retune_cost_s!r}, expected >= 0")
        for name in ("report_interval_s", "series_bin_s", "refit_interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise PolluxSimError(f"{name} is {value!r}, expected a finite number > 0")


@dataclass
class SimTrainer:
    """A simulated trainer: its agent (what it saw and fitted) and the truth it achieved.

    ``config`` is what it runs now (None without nodes); the agent knows the same
    configuration from ``set_config`` whenever it runs.
    """

    spec: PolluxJob
    app: SimApp
    rng: np.random.Generator
    agent: PolluxAgent
    cadence: RetuneCadence
    config: TrainerConfig | None = None
    placement: tuple[int, ...] | None = None  # slots: replicas per node, ascending
    progress: float = 0.0  # true statistical progress, base-batch steps
    next_check_s: float = math.inf  # next refit-and-report check while it runs
    last_fit_s: float = -math.inf
    refits: int = 0
    reports: int = 0
    retune_decisions: int = 0
    retune_cost_samples: float = 0.0
    samples: float = 0.0
    statistical_samples: float = 0.0
    run_s: float = 0.0
    efficiency_s: float = 0.0
    batch_s: float = 0.0
    fallback_s: float = 0.0
    model_error_sum: float = 0.0
    model_error_n: int = 0
    finished_s: float | None = None
    configs: set[TrainerConfig] = field(default_factory=set)

    @property
    def done(self) -> bool:
        return self.progress >= self.app.target_progress * (1 - DONE_RTOL)

    def run(self, config: TrainerConfig | None) -> None:
        """Run ``config`` from now on (None: no nodes); the agent learns it too."""
        self.config = config
        if config is not None:
            self.agent.set_config(
                config.nodes, config.local_bsz, config.accum_steps, replicas=config.replicas
            )
            self.configs.add(config)


@dataclass(frozen=True)
class PolluxReport:
    """What a replay with :class:`PolluxSimDriver` adds to the plain outputs (plain data,
    so it travels between processes)."""

    options: dict[str, Any]
    series: list[dict[str, Any]]
    trainers: dict[str, dict[str, Any]]
    summary: dict[str, Any]
