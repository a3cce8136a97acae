"""The noise probe: feeds a :class:`~bftrainer.trainers.agent.PolluxAgent`'s gradient
noise estimator from a torch model's ``.grad``, at a budgeted share of the step time.

Its work stays on the gradients' device, per tensor (``torch._foreach`` kernels into
persistent buffers), and its cost is measured on the device's clock where there is one
(CUDA events), so a large model on a GPU is not probed at every step for want of a
host clock that sees the kernels.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

from bftrainer.trainers.agent import ConfigError, PolluxAgent, TrainerConfig
from bftrainer.trainers.gns import from_consecutive

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

# Share of the step time the probe's gradient reads may take, and the longest interval
# between two measurements that this may stretch to.
DEFAULT_PROBE_BUDGET = 0.005
MAX_PROBE_EVERY = 128
# Estimates the probe keeps on the device before it reads them all at once.
PENDING_LIMIT = 64


def bias_corrections(beta2: float, steps: list[Any]) -> list[Any]:
    """Adam's ``1 - beta2 ** step`` for each parameter's step count: floats from counts
    on the host; 0-dim tensors computed on the device from counts kept there (capturable
    or fused Adam), since reading each would wait for the device once per parameter."""
    if steps and all(hasattr(s, "device") and s.device.type != "cpu" for s in steps):
        import torch

        with torch.no_grad():
            out = torch._foreach_pow(beta2, steps)
            torch._foreach_mul_(out, -1.0)
            torch._foreach_add_(out, 1.0)
        return list(out)
    return [1.0 - beta2 ** float(s) for s in steps]


class TorchGradientProbe:
    """Feeds an agent's noise estimator from a torch model's ``.grad`` after ``backward()``.

    It reads the gradient the optimizer is about to apply, which is the average over
    the step's total batch M (all replicas after the all-reduce, all accumulation
    micro-steps when the loss is divided by their number), and uses the differenced
    estimator over whole steps, valid for any replicas and accumulation. At the start of a
    cycle of ``every`` steps it keeps a copy of the (pre-conditioned) gradient, pairs it
    with the next step's, and skips the rest of the cycle; the estimate is weighted as
    ``every`` steps of data (``every=1``: every two consecutive steps form a pair).
    Reading and copying the gradient costs about a few optimizer updates, which is a
    large share of a small model's step; so by default ``every`` adapts after each
    cycle to keep the probe's measured cost within ``budget`` of the agent's last step
    time (up to ``MAX_PROBE_EVERY``). A large model gets ``every=1`` (as in Pollux).
    The norms and products stay on the gradients' device, so a step never waits for
    the GPU here; :meth:`flush` hands them to the agent in one read (call it before the
    agent's PGNS is wanted: a report, a choice of batch size).

    With an Adam or AdamW optimizer, P is Adam's ``1 / (sqrt(v_hat) + eps)`` from the
    optimizer's state (steps before its first update are skipped). With several
    replicas, the group estimator uses more of each step's information: call
    :meth:`squared_norm` on the local gradient before the all-reduce and on the
    averaged one after, all-reduce the local value, and pass both to
    ``agent.observe_gradient_norms`` instead.
    """

    def __init__(
        self,
        agent: PolluxAgent,
        model: Any,
        optimizer: Any | None = None,
        every: int | None = None,
        budget: float = DEFAULT_PROBE_BUDGET,
    ) -> None:
        import torch

        if every is not None and every < 1:
            raise ConfigError(f"probe interval every must be >= 1, got {every}")
        if not 0 < budget <= 1:
            raise ConfigError(f"probe budget must be in (0, 1], got {budget!r}")
        self._torch = torch
        self.agent = agent
        self.adaptive = every is None
        self.every = 1 if every is None else every
        self.budget = budget
        self.params: list[torch.nn.Parameter] = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = optimizer
        self._adam = optimizer is not None and isinstance(
            optimizer, torch.optim.Adam | torch.optim.AdamW
        )
        self._skip = 0
        self._cycle_cost_s = 0.0
        self._cost_s: float | None = None  # smoothed cost of one measurement cycle
        self._prev: list[torch.Tensor] | None = None
        self._prev_sqr: torch.Tensor | None = None
        self._buffers: dict[str, list[torch.Tensor]] = {}
        self._cuda = any(p.device.type == "cuda" for p in self.params)
        self._timings: list[tuple[Any, Any]] = []  # CUDA event pairs not read yet
        self._device_cost_s: float | None = None
        self._prev_config: TrainerConfig | None = None
        # (|g1|^2, |g2|^2, g1.g2) on the device, batch size, weight in samples
        self._pending: list[tuple[torch.Tensor, int, int]] = []

    def _grads(self) -> list[torch.Tensor] | None:
        """The (pre-conditioned) gradient, one tensor per parameter; None if not formed.

        Per tensor, with ``torch._foreach`` kernels (a few launches in all, whatever the
        number of tensors), into persistent buffers: nothing is concatenated or
        allocated per step. Without Adam, the ``.grad`` themselves.
        """
        torch = self._torch
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return None
        if not self._adam:
            return grads
        assert self.optimizer is not None
        second, grads, eps, bias = [], [], [], []
        for group in self.optimizer.param_groups:
            steps = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.optimizer.state.get(p)
                if not state or "exp_avg_sq" not in state:
                    return None
                grads.append(p.grad)
                second.append(state["exp_avg_sq"])
                steps.append(state["step"])
            eps += [group["eps"]] * len(steps)
            bias += bias_corrections(group["betas"][1], steps)
        out = self._buffer("cur", grads)
        with torch.no_grad():
            torch._foreach_copy_(out, second)
            torch._foreach_div_(out, bias)
            torch._foreach_sqrt_(out)
            torch._foreach_add_(out, eps)
            torch._foreach_reciprocal_(out)
            torch._foreach_mul_(out, grads)
        return out

    def _buffer(self, name: str, like: list[torch.Tensor]) -> list[torch.Tensor]:
        """A persistent buffer shaped as ``like`` (made again if the shapes change)."""
        buf = self._buffers.get(name)
        if buf is None or [b.shape for b in buf] != [t.shape for t in like]:
            buf = [self._torch.empty_like(t) for t in like]
            self._buffers[name] = buf
        return buf

    def _squared_norm(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """sum |t|^2 over ``tensors``, in double, on their device (no read)."""
        torch = self._torch
        norms = torch._foreach_norm(tensors)
        return torch.stack(norms).double().square().sum()

    def squared_norm(self) -> float | None:
        """|P g|^2 of the gradients now in ``.grad`` (None before Adam's first step)."""
        grads = self._grads()
        return None if grads is None else float(self._squared_norm(grads))

    def after_backward(self) -> None:
        """Call once per step after ``backward()`` and before ``zero_grad()``.

        The products stay on the gradients' device: nothing here waits for the device.
        The estimates reach the agent at :meth:`flush` (or when ``PENDING_LIMIT`` wait).
        """
        if self._prev is None and self._skip > 0:
            self._skip -= 1
            return
        torch = self._torch
        t0 = time.perf_counter()
        timing = self._device_timing()
        if timing is not None:
            timing[0].record()
        cur = self._grads()
        if cur is None:
            self._prev = None
            return
        config = self.agent.config
        with torch.no_grad():
            sqr = self._squared_norm(cur)
            prev = self._prev
            closing = prev is not None
            if (
                prev is not None
                and self._prev_sqr is not None
                and self._prev_config == config
                and [t.shape for t in prev] == [t.shape for t in cur]
            ):
                b = config.batch_size  # .grad is averaged over the whole step
                # g1.g2 = (|g1 + g2|^2 - |g1|^2 - |g2|^2) / 2: no per-tensor dot exists
                torch._foreach_add_(prev, cur)
                dot = (self._squared_norm(prev) - self._prev_sqr - sqr) / 2
                products = torch.stack((self._prev_sqr, sqr, dot))
                self._pending.append((products, b, self.every * b))
            self._prev = None
            if not closing or self.every == 1:  # open a pair: keep this gradient
                if self._adam:  # the two buffers change roles
                    self._buffers["cur"] = self._buffers.get("prev") or []
                    self._buffers["prev"] = cur
                    self._prev = cur
                else:
                    self._prev = self._buffer("prev", cur)
                    torch._foreach_copy_(self._prev, cur)
                self._prev_sqr = sqr
                self._prev_config = config
        if timing is not None:
            timing[1].record()
            self._timings.append(timing)
        self._cycle_cost_s += time.perf_counter() - t0
        if closing:
            self._end_cycle()
        if len(self._pending) >= PENDING_LIMIT:
            self.flush()

    def _device_timing(self) -> tuple[Any, Any] | None:
        """A pair of CUDA events to time a measurement on the device; None on a CPU."""
        if not self._cuda:
            return None
        torch = self._torch
        return (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))

    def flush(self) -> None:
        """Hand the estimates kept on the device to the agent's noise estimator: one
        read of the device for all of them (before the agent's PGNS is used)."""
        if not self._pending:
            return
        values = self._torch.stack([p for p, _, _ in self._pending]).tolist()
        for (prev_sqr, sqr, dot), (_, b, weight) in zip(values, self._pending, strict=True):
            self.agent.gns.update(from_consecutive(prev_sqr, sqr, dot, b, b), weight)
        self._pending = []

    def _end_cycle(self) -> None:
        """Choose the next interval from the measured cost and the mean step time.

        The cost is the device's where it has a clock of its own (CUDA events, read
        once done, never waited for), else the host's.
        """
        cost = self._cycle_cost_s
        done = [t for t in self._timings if t[1].query()]
        if done:
            device_s = sum(a.elapsed_time(b) for a, b in done) / 1000.0 / len(done)
            self._device_cost_s = 2 * device_s  # two measurements a cycle
            self._timings = [t for t in self._timings if t not in done]
        self._timings = self._timings[-8:]
        if self._device_cost_s is not None:
            cost = max(cost, self._device_cost_s)
        self._cost_s = cost if self._cost_s is None else 0.8 * self._cost_s + 0.2 * cost
        step_s = self.agent.mean_step_time_s or self.agent.last_step_time_s
        if self.adaptive and step_s:
            wanted = math.ceil(self._cost_s / (self.budget * step_s))
            self.every = max(1, min(MAX_PROBE_EVERY, wanted))
        self._cycle_cost_s = 0.0
        self._skip = max(self.every - 2, 0)
