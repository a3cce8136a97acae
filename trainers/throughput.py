"""Step-time model of data-parallel training and its fit (Pollux, OSDI'21, §3.2).

Equation labels are those of docs/goodput.md.

A trainer runs K replicas on n whole nodes (K = n r with r replicas per node); each
replica computes the gradient of m samples (the *local* batch), s extra times when it
accumulates gradients, and then all replicas average their gradients:

    T_grad(m)   = alpha_grad + beta_grad * m                              (T1)
    T_sync(n,K) = 0                                  if K = 1
                = alpha_intra + beta_intra * (K - 2)  if n = 1 < K        (T2)
                = alpha_inter + beta_inter * (K - 2)  if n > 1
    T_iter      = (T_grad^gamma + T_sync^gamma)^(1 / gamma),  gamma in [1, 10]  (T3)
    T_step      = s * T_grad + T_iter                                     (T4)

gamma = 1 is no overlap of computation and communication, gamma -> inf is perfect
overlap. One step processes the total batch M = K m (s + 1).

The seven parameters are fitted to observed steps by minimising the root mean squared
log error (RMSLE) under bounds with L-BFGS-B (time parameters in log space, analytic
gradient, three starting values of gamma; a tiny pull of gamma towards 1 settles it
where the data cannot). Parameters of a regime not observed yet follow Pollux's
exploration priors (§4.1), which are optimistic so that the scheduler tries it:

* no step with K > 1 seen: no synchronisation cost at all (perfect scaling);
* no multi-node step seen but single-node multi-replica steps seen: inter-node cost
  equals the intra-node one (it is at least that in reality); a missing intra-node
  pair stays 0;
* no step with K > 2 seen in a regime: its retrogression beta is 0;
* one local batch size seen: alpha_grad is fixed at half the compute time per micro-step,
  so larger batches look cheaper per sample than linear extrapolation.

The growth cap (at most twice the largest node count seen) is applied by
:class:`bftrainer.trainers.goodput.GoodputModel` from ``ThroughputModel.max_nodes_seen``.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, NDArray

from bftrainer.common.names import repeated_column

logger = logging.getLogger(__name__)

GAMMA_MIN, GAMMA_MAX = 1.0, 10.0
# Bounds of the time parameters (s; s per sample or per replica). The fit works on their
# logarithms, so they must stay positive; a parameter fixed at 0 is not optimised.
TIME_MIN_S, TIME_MAX_S = 1e-9, 1e4
# Pull gamma gently towards 1 where the data cannot tell it apart (flat directions).
GAMMA_REGULARISATION = 1e-5
GAMMA_STARTS = (1.0, 2.0, 4.0)

OBS_COLUMNS = ("nodes", "local_bsz", "accum_steps", "step_time_s")
OPTIONAL_OBS_COLUMNS = ("replicas",)
# Parameter indices, in ThroughputParams' field order.
_AG, _BG, _AN, _BN, _AR, _BR, _GAMMA = range(7)


class ObservationError(ValueError):
    """An observed step that cannot be right (non-positive time, K < n, ...)."""


class ObservationFileError(ValueError):
    """An observations CSV that cannot be read; the message names the file and line."""


class FitError(RuntimeError):
    """The throughput model cannot be fitted (no observations)."""


@dataclass(frozen=True)
class ThroughputParams:
    """The seven parameters of (T1)-(T3) (seconds; per sample or per extra replica)."""

    alpha_grad_s: float
    beta_grad_s: float
    alpha_intra_s: float
    beta_intra_s: float
    alpha_inter_s: float
    beta_inter_s: float
    gamma: float

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"throughput parameter {f.name} must be finite >= 0, got {v!r}")
        if not GAMMA_MIN <= self.gamma <= GAMMA_MAX:
            raise ValueError(f"gamma must be in [{GAMMA_MIN}, {GAMMA_MAX}], got {self.gamma!r}")

    def as_array(self) -> NDArray[np.float64]:
        return np.array([getattr(self, f.name) for f in fields(self)], dtype=float)

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


# An observed step is at least a microsecond (a kernel launch takes several).
MIN_STEP_S = 1e-6
# The largest machines have ~10^4 nodes and ~10^5 GPUs; a step is seconds, not days.
OBSERVATION_LIMITS = {
    "nodes": 1e6,
    "replicas": 1e8,
    "local_bsz": 1e9,
    "accum_steps": 1e6,
    "step_time_s": 1e6,
}


@dataclass(frozen=True)
class StepObservation:
    """One observed optimizer step (or the mean of several at the same configuration).

    ``replicas`` is the total K over all ``nodes``; ``local_bsz`` is per replica and per
    micro-step; ``accum_steps`` is s, the extra micro-steps before the sync.
    """

    nodes: int
    replicas: int
    local_bsz: int
    accum_steps: int
    step_time_s: float

    def __post_init__(self) -> None:
        # Beyond these no real step was observed: a typo (1e20 nodes) would otherwise be
        # fitted and reported with errors of 1e14 %.
        for name, limit in OBSERVATION_LIMITS.items():
            if getattr(self, name) > limit:
                raise ObservationError(
                    f"{name} is {getattr(self, name)!r}, more than any real step ({limit:g})"
                )
        if self.nodes < 1:
            raise ObservationError(f"nodes must be >= 1, got {self.nodes}")
        if self.replicas < self.nodes:
            raise ObservationError(
                f"replicas {self.replicas} < nodes {self.nodes}: every node runs a replica"
            )
        if self.local_bsz < 1:
            raise ObservationError(f"local_bsz must be >= 1, got {self.local_bsz}")
        if self.accum_steps < 0:
            raise ObservationError(f"accum_steps must be >= 0, got {self.accum_steps}")
        if not (math.isfinite(self.step_time_s) and self.step_time_s > 0):
            raise ObservationError(f"step_time_s must be finite > 0, got {self.step_time_s!r}")


def predict_step_time(
    params: ThroughputParams,
    nodes: ArrayLike,
    replicas: ArrayLike,
    local_bsz: ArrayLike,
    accum_steps: ArrayLike = 0,
) -> NDArray[np.float64]:
    """T_step of (T4) for every configuration (numpy broadcasting)."""
    return _step_time(params.as_array(), nodes, replicas, local_bsz, accum_steps)


def _step_time(
    p: NDArray[np.float64],
    nodes: ArrayLike,
    replicas: ArrayLike,
    local_bsz: ArrayLike,
    accum_steps: ArrayLike,
) -> NDArray[np.float64]:
    n = np.asarray(nodes, dtype=float)
    k = np.asarray(replicas, dtype=float)
    m = np.asarray(local_bsz, dtype=float)
    s = np.asarray(accum_steps, dtype=float)
    t_grad = p[0] + p[1] * m  # (T1)
    retro = np.maximum(k - 2.0, 0.0)
    t_sync = np.where(  # (T2)
        k <= 1, 0.0, np.where(n <= 1, p[2] + p[3] * retro, p[4] + p[5] * retro)
    )
    g = p[6]
    # (T3), scaled by the larger term so that t^gamma cannot overflow or underflow.
    big = np.maximum(t_grad, t_sync)
    safe = np.where(big > 0, big, 1.0)
    t_iter = big * ((t_grad / safe) ** g + (t_sync / safe) ** g) ** (1.0 / g)
    return np.asarray(s * t_grad + t_iter, dtype=float)  # (T4)


def _step_time_jacobian(
    p: NDArray[np.float64],
    n: NDArray[np.float64],
    k: NDArray[np.float64],
    m: NDArray[np.float64],
    s: NDArray[np.float64],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """T_step and its derivatives by the seven parameters (rows: observations)."""
    t_grad = p[_AG] + p[_BG] * m
    retro = np.maximum(k - 2.0, 0.0)
    intra = (k > 1) & (n <= 1)
    inter = (k > 1) & (n > 1)
    t_sync = np.where(intra, p[_AN] + p[_BN] * retro, np.where(inter, p[_AR] + p[_BR] * retro, 0.0))
    g = p[_GAMMA]
    big = np.maximum(t_grad, t_sync)
    x = t_grad / big
    y = t_sync / big
    xg, yg = x**g, y**g
    u = xg + yg
    t_iter = big * u ** (1.0 / g)
    # d t_iter / d t_grad = (t_grad / t_iter)^(g-1), likewise for t_sync (0 when no sync).
    r = big / t_iter
    d_grad = (x * r) ** (g - 1.0)
    d_sync = np.where(t_sync > 0, (y * r) ** (g - 1.0), 0.0)
    log_x = np.log(np.where(x > 0, x, 1.0))
    log_y = np.log(np.where(y > 0, y, 1.0))
    d_gamma = t_iter * (-np.log(u) / g**2 + (xg * log_x + yg * log_y) / (g * u))
    jac = np.empty((m.size, 7))
    jac[:, _AG] = s + d_grad
    jac[:, _BG] = m * (s + d_grad)
    jac[:, _AN] = np.where(intra, d_sync, 0.0)
    jac[:, _BN] = np.where(intra, d_sync * retro, 0.0)
    jac[:, _AR] = np.where(inter, d_sync, 0.0)
    jac[:, _BR] = np.where(inter, d_sync * retro, 0.0)
    jac[:, _GAMMA] = d_gamma
    return s * t_grad + t_iter, jac


@dataclass(frozen=True)
class ThroughputModel:
    """Fitted parameters and what the fit saw.

    ``max_nodes_seen`` feeds the exploration cap; ``rmsle`` is the fit's error on its
    own observations (without the regularisation term). ``free_params`` is how many
    parameters the fit chose (the others fixed or tied by what was seen) and
    ``distinct_configs`` how many different (nodes, replicas, local_bsz, accum_steps)
    it saw: no more configs than free parameters is an under-determined fit (the
    others were fixed by assumption), whose RMSLE (0 when it interpolates) says nothing
    about predictions elsewhere.
    """

    params: ThroughputParams
    rmsle: float
    observations: int
    max_nodes_seen: int
    max_replicas_seen: int
    # Diagnostics of the fit, not part of the model: not compared, not serialised.
    free_params: int = field(default=0, compare=False)
    distinct_configs: int = field(default=0, compare=False)

    @property
    def under_determined(self) -> bool:
        return self.distinct_configs <= self.free_params

    def step_time_s(
        self,
        nodes: ArrayLike,
        replicas: ArrayLike,
        local_bsz: ArrayLike,
        accum_steps: ArrayLike = 0,
    ) -> NDArray[np.float64]:
        """Predicted seconds per optimizer step, (T4)."""
        return predict_step_time(self.params, nodes, replicas, local_bsz, accum_steps)


def fit_throughput(observations: Sequence[StepObservation]) -> ThroughputModel:
    """Fit (T1)-(T4) to observed steps (minimum RMSLE, L-BFGS-B, Pollux's priors)."""
    # Imported here: only a fit needs scipy, and `bftrainer status` reads this module.
    from scipy.optimize import minimize

    if not observations:
        raise FitError("no step observations to fit the throughput model to")
    n = np.array([o.nodes for o in observations], dtype=float)
    k = np.array([o.replicas for o in observations], dtype=float)
    m = np.array([o.local_bsz for o in observations], dtype=float)
    s = np.array([o.accum_steps for o in observations], dtype=float)
    t = np.array([o.step_time_s for o in observations], dtype=float)
    log_t = np.log(t)

    single = k == 1
    micro = t / (s + 1.0)  # an upper bound of T_grad for every step
    t_micro = float(np.min(micro[single])) if np.any(single) else float(np.min(micro))
    seen_intra = bool(np.any((n == 1) & (k > 1)))
    seen_inter = bool(np.any(n > 1))
    retro_intra = bool(np.any((n == 1) & (k > 2)))
    retro_inter = bool(np.any((n > 1) & (k > 2)))

    # Each parameter is free (optimised in log space), fixed, or tied to another.
    fixed: dict[int, float] = {}
    tied: dict[int, int] = {}
    if len(np.unique(m)) < 2:
        fixed[_AG] = max(t_micro / 2.0, TIME_MIN_S)
    if not seen_intra and not seen_inter:
        fixed.update({_AN: 0.0, _BN: 0.0, _AR: 0.0, _BR: 0.0, _GAMMA: 1.0})
    else:
        if not seen_intra:
            fixed.update({_AN: 0.0, _BN: 0.0})
        elif not retro_intra:
            fixed[_BN] = 0.0
        if not seen_inter:
            tied.update({_AR: _AN, _BR: _BN})
        elif not retro_inter:
            fixed[_BR] = 0.0
    free = [i for i in range(7) if i not in fixed and i not in tied]

    def expand(x: NDArray[np.float64]) -> NDArray[np.float64]:
        p = np.empty(7)
        for i, v in fixed.items():
            p[i] = v
        for j, i in enumerate(free):
            p[i] = x[j] if i == _GAMMA else math.exp(x[j])
        for i, src in tied.items():
            p[i] = p[src]
        return p

    def objective(x: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        """Mean squared log error (+ the gamma prior) and its gradient in x."""
        p = expand(x)
        pred, jac = _step_time_jacobian(p, n, k, m, s)
        err = np.log(pred) - log_t
        reg = GAMMA_REGULARISATION * (p[_GAMMA] - 1.0) ** 2
        d_full = 2.0 * (err / pred) @ jac / err.size
        d_full[_GAMMA] += 2.0 * GAMMA_REGULARISATION * (p[_GAMMA] - 1.0)
        for i, src in tied.items():
            d_full[src] += d_full[i]
        d_x = np.array([d_full[i] * (1.0 if i == _GAMMA else p[i]) for i in free])
        return float(np.mean(err**2) + reg), d_x

    guess = _initial_guess(n, k, m, s, t, t_micro)
    bounds = [
        (GAMMA_MIN, GAMMA_MAX) if i == _GAMMA else (math.log(TIME_MIN_S), math.log(TIME_MAX_S))
        for i in free
    ]
    best_x: NDArray[np.float64] | None = None
    best_f = math.inf
    starts = GAMMA_STARTS if _GAMMA in free else (1.0,)
    for gamma0 in starts:
        x0 = np.array(
            [gamma0 if i == _GAMMA else math.log(max(guess[i], TIME_MIN_S)) for i in free]
        )
        if not free:
            best_x, best_f = x0, objective(x0)[0]
            break
        result = minimize(objective, x0, jac=True, method="L-BFGS-B", bounds=bounds)
        if result.fun < best_f:
            best_x, best_f = np.asarray(result.x, dtype=float), float(result.fun)
    assert best_x is not None
    p = expand(best_x)
    params = ThroughputParams(*(float(v) for v in p))
    pred = _step_time(p, n, k, m, s)
    rmsle = float(np.sqrt(np.mean((np.log(pred) - log_t) ** 2)))
    logger.debug("fitted %s to %d observations, RMSLE %.4f", params, len(observations), rmsle)
    return ThroughputModel(
        params=params,
        rmsle=rmsle,
        observations=len(observations),
        max_nodes_seen=int(np.max(n)),
        max_replicas_seen=int(np.max(k)),
        free_params=len(free),
        distinct_configs=len({(a, b, c, d) for a, b, c, d in zip(n, k, m, s, strict=True)}),
    )


def _initial_guess(
    n: NDArray[np.float64],
    k: NDArray[np.float64],
    m: NDArray[np.float64],
    s: NDArray[np.float64],
    t: NDArray[np.float64],
    t_micro: float,
) -> NDArray[np.float64]:
    """Starting point: compute split half fixed, half per sample; sync from the excess."""
    p = np.zeros(7)
    p[_AG] = t_micro / 2.0
    p[_BG] = t_micro / 2.0 / float(np.median(m))
    compute = p[_AG] + p[_BG] * m
    excess = t - (s + 1.0) * compute
    for a, b, mask in ((_AN, _BN, (n == 1) & (k > 1)), (_AR, _BR, n > 1)):
        pos = excess[mask & (excess > 0)]
        p[a] = float(np.median(pos)) if pos.size else t_micro / 10.0
        p[b] = p[a] / 10.0
    p[_GAMMA] = 1.0
    return p


def observations_from_rows(
    rows: Iterable[dict[str, str]], source: str, first_line: int = 2
) -> list[StepObservation]:
    """Parse CSV rows (``nodes,local_bsz,accum_steps,step_time_s[,replicas]``).

    ``replicas`` defaults to ``nodes`` (one replica per node). Errors name
    ``source:line`` and the column.
    """
    out = []
    for line, row in enumerate(rows, start=first_line):
        where = f"{source}:{line}"
        try:
            values = {c: row[c] for c in OBS_COLUMNS}
        except KeyError as e:
            raise ObservationFileError(f"{where}: missing column {e.args[0]!r}") from None
        try:
            nodes = _int(values["nodes"], "nodes")
            replicas_text = row.get("replicas")
            replicas = nodes if replicas_text in (None, "") else _int(replicas_text, "replicas")
            step_s = _float(values["step_time_s"], "step_time_s")
            if 0 < step_s < MIN_STEP_S:
                # A subnormal or nanosecond step was fitted (the model floors far above
                # it) and shown as an error of +inf %.
                raise ValueError(
                    f"step_time_s is {step_s!r}, less than any real step ({MIN_STEP_S:g} s)"
                )
            obs = StepObservation(
                nodes=nodes,
                replicas=replicas,
                local_bsz=_int(values["local_bsz"], "local_bsz"),
                accum_steps=_int(values["accum_steps"], "accum_steps"),
                step_time_s=step_s,
            )
        except (ObservationError, ValueError) as e:
            raise ObservationFileError(f"{where}: {e}") from None
        out.append(obs)
    return out


def read_observations_csv(path: str | Path) -> list[StepObservation]:
    """Read an observations CSV; see :func:`observations_from_rows` for the columns."""
    p = Path(path)
    try:
        with p.open(newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            twice = repeated_column(header)
            if twice is not None:
                raise ObservationFileError(
                    f"{p}:1: column {twice!r} appears more than once in header {','.join(header)!r}"
                )
            missing = [c for c in OBS_COLUMNS if c not in header]
            if missing:
                raise ObservationFileError(
                    f"{p}:1: missing column(s) {', '.join(missing)}; "
                    f"expected {','.join(OBS_COLUMNS)}[,replicas]"
                )
            obs = observations_from_rows(reader, str(p))
    except OSError as e:
        raise ObservationFileError(f"{p}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ObservationFileError(f"{p}: not a text (UTF-8) file") from None
    if not obs:
        raise ObservationFileError(f"{p}: no observation rows")
    return obs


def _int(text: str | None, column: str) -> int:
    try:
        value = float(text or "")
    except ValueError:
        raise ValueError(f"{column} is {text!r}, not a number") from None
    if not value.is_integer():
        raise ValueError(f"{column} is {text!r}, not a whole number")
    return int(value)


def _float(text: str | None, column: str) -> float:
    try:
        return float(text or "")
    except ValueError:
        raise ValueError(f"{column} is {text!r}, not a number") from None
