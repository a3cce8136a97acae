"""The gradient sum over replicas: device buckets whose all-reduce overlaps ``backward()``.

As PyTorch's DDP does (its C++ ``Reducer``): the trainable parameters, in reverse order
(their gradients are formed roughly last layer first), are grouped into buckets of
about ``bucket_bytes``; a hook on each parameter copies its gradient into its bucket as
soon as ``backward()`` has accumulated it, and a full bucket starts its all-reduce at
once, while the rest of the backward pass runs. Buckets start in the same order on
every rank (a bucket waits for those before it), as a process group requires.

The last bucket is started by :meth:`GradientReducer.finish`, after ``backward()``
returns (DDP's last bucket cannot start earlier either): it carries the step's flags,
the numbers every rank must agree on (commit, stop, hosts updated, leaving, rank 0's
learning-rate factor), so they cost no collective of their own. Everything stays on the
gradients' device: NCCL reduces GPU buckets, gloo CPU ones.

Sums, not means: each rank's loss is already its share of the step's mean (the runtime
weights it by its samples), and a rank with no sample in a step adds zeros.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from bftrainer.trainers.comm import Comm

logger = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket_cap_mb
FLAG_DTYPES = ("torch.float32", "torch.float64")  # exact enough for the LR factor


class _Bucket:
    __slots__ = ("flags", "flat", "handle", "name", "params", "ready", "views", "waiting")

    def __init__(self, name: str, params: list[Any], flags: int, torch: Any) -> None:
        self.name = name
        sizes = [p.numel() for p in params]
        dtype = params[0].dtype if params else torch.float32
        device = params[0].device if params else None
        self.flat = torch.zeros(sum(sizes) + flags, dtype=dtype, device=device)
        self.params = params
        self.views = list(self.flat[: sum(sizes)].split(sizes)) if params else []
        self.waiting = len(params)
        self.ready = [False] * len(params)
        self.handle: Any = None
        self.flags = flags


class GradientReducer:
    """Sums the ``.grad`` of ``params`` over ``comm``'s ranks, bucket by bucket.

    Per step: :meth:`arm` before the step's last ``backward()`` (earlier micro-steps of
    gradient accumulation only accumulate), then :meth:`finish` with the step's flags,
    which returns the flags summed over the ranks, as a tensor on the device.
    """

    def __init__(
        self,
        params: list[Any],
        comm: Comm,
        flags: int,
        *,
        device: torch.device,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ) -> None:
        import torch

        self._torch = torch
        self.comm = comm
        self.device = device
        self.nflags = flags
        groups: list[list[Any]] = []
        size = 0
        for p in reversed(params):
            nbytes = p.numel() * p.element_size()
            if not groups or size + nbytes > bucket_bytes or groups[-1][0].dtype != p.dtype:
                groups.append([])
                size = 0
            groups[-1].append(p)
            size += nbytes
        last_dtype = str(groups[-1][0].dtype) if groups else ""
        own_flags_bucket = last_dtype not in FLAG_DTYPES
        flags_at = -1 if own_flags_bucket else len(groups) - 1
        self.buckets = [
            _Bucket(f"grads.{i}", g, flags if i == flags_at else 0, torch)
            for i, g in enumerate(groups)
        ]
        if own_flags_bucket:  # half-precision gradients: the flags in float32 of their own
            self.buckets.append(_Bucket("flags", [], flags, torch))
            self.buckets[-1].flat = torch.zeros(flags, dtype=torch.float32, device=device)
        self._where = {id(p): (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self._armed = False
        self._next = 0  # the first bucket not started yet
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in params]

    @property
    def flags_dtype(self) -> torch.dtype:
        return self.buckets[-1].flat.dtype

    def close(self) -> None:
        """Remove the hooks (the runtime is done with this group)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def arm(self) -> None:
        """The next ``backward()`` is the step's last: start buckets as they fill."""
        for b in self.buckets:
            b.waiting = len(b.params)
            b.ready = [False] * len(b.params)
            b.handle = None
        self._next = 0
        self._armed = True

    def _on_grad(self, p: Any) -> None:
        if not self._armed:
            return
        bucket, i = self._where[id(p)]
        if bucket.ready[i]:
            return
        bucket.views[i].copy_(p.grad.reshape(-1))
        bucket.ready[i] = True
        bucket.waiting -= 1
        if bucket.waiting == 0:
            self._start_ready()

    def _start_ready(self) -> None:
        last = len(self.buckets) - 1
        while self._next < last and self.buckets[self._next].waiting == 0:
            self._start(self.buckets[self._next])
            self._next += 1

    def _start(self, bucket: _Bucket) -> None:
        bucket.handle = self.comm.allreduce_sum_async(bucket.flat, bucket.name)

    def finish(self, flags: tuple[float, ...]) -> torch.Tensor:
        """Start what is left (gradients not formed here count as zeros), the flags in
        the last bucket; wait; write the sums back to ``.grad``. Returns the summed flags."""
        torch = self._torch
        if not self._armed:
            self.arm()  # this rank had no sample in the step: it sends zeros
        self._armed = False
        for bucket in self.buckets[self._next :]:
            self._fill(bucket)
        last = self.buckets[-1]
        # From pageable memory: CUDA stages the few bytes at once and the host goes on
        # (a blocking copy would wait for the whole stream).
        flags_host = torch.tensor(flags, dtype=last.flat.dtype)
        last.flat[-self.nflags :].copy_(flags_host, non_blocking=True)
        for bucket in self.buckets[self._next :]:
            self._start(bucket)
        self._next = len(self.buckets)
        for bucket in self.buckets:
            bucket.handle.wait()
            bucket.handle = None
            for p, view in zip(bucket.params, bucket.views, strict=True):
                summed = view.view_as(p)
                if p.grad is None:
                    p.grad = summed.clone()
                else:
                    p.grad.copy_(summed)
        return last.flat[-self.nflags :]

    @staticmethod
    def _fill(bucket: _Bucket) -> None:
        for i, p in enumerate(bucket.params):
            if bucket.ready[i]:
                continue
            if p.grad is None:
                bucket.views[i].zero_()
            else:  # formed in an earlier micro-step, or no hook fired (no sample now)
                bucket.views[i].copy_(p.grad.reshape(-1))
            bucket.ready[i] = True
        bucket.waiting = 0


class LaggedFlags:
    """A step's summed flags, read on the host one step later.

    Reading them at once would make the host wait for the device at every step (the
    plain loop never does). Instead their copy to (pinned) host memory is queued behind
    the all-reduce, and read at the next step, long done by then. Every rank reads the
    same step's flags at the same step, so they still act together. ``tag`` is what the
    caller needs to know about the step that sent them.
    """

    def __init__(self, count: int, device: torch.device, dtype: torch.dtype) -> None:
        import torch

        cuda = device.type == "cuda"
        self._host = torch.zeros(count, dtype=dtype, pin_memory=cuda)
        self._event = torch.cuda.Event() if cuda else None
        self._tag: Any = None

    def exchange(self, summed: torch.Tensor, tag: Any) -> tuple[list[float], Any] | None:
        """Queue this step's ``summed`` flags; return the previous step's (None at the
        first step)."""
        previous = None
        if self._tag is not None:
            if self._event is not None:
                self._event.synchronize()
            previous = (self._host.tolist(), self._tag)
        self._host.copy_(summed, non_blocking=True)
        if self._event is not None:
            self._event.record()
        self._tag = tag
        return previous
