"""The gradient sum over replicas: device buckets whose all-reduce overlaps ``backward()``.

As PyTorch's DDP does (its C++ ``Reducer``): the trainable parameters, in reverse order
(their gradients are formed roughly last layer first), are grouped into buckets of
about ``bucket_bytes``; each ``.grad`` is a view into its bucket (DDP's
``gradient_as_bucket_view``), so ``backward()`` accumulates there and nothing is copied
in or out; a hook on each parameter counts the gradients formed, and a full bucket
starts its all-reduce at once, while the rest of the backward pass runs.
:meth:`GradientReducer.zero_grad` zeroes the buckets (one kernel each) instead of the
optimizer's per-parameter ``zero_grad``, which would drop the views. Buckets start in
the same order on every rank (a bucket waits for those before it), as a process group requires.

The last bucket is started by :meth:`GradientReducer.finish`, after ``backward()``
returns (DDP's last bucket cannot start earlier either): it carries the step's flags,
the numbers every rank must agree on (commit, stop, hosts updated, leaving, rank 0's
learning-rate factor, its batch), so they cost no collective of their own. They are
written into a persistent host buffer (pinned, two in turn, on a GPU), never a new
tensor per step. Everything stays on the
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
    __slots__ = (
        "flags",
        "flat",
        "grads",
        "handle",
        "name",
        "params",
        "ready",
        "views",
        "waiting",
    )

    def __init__(self, name: str, params: list[Any], flags: int, torch: Any) -> None:
        self.name = name
        sizes = [p.numel() for p in params]
        dtype = params[0].dtype if params else torch.float32
        device = params[0].device if params else None
        self.flat = torch.zeros(sum(sizes) + flags, dtype=dtype, device=device)
        self.params = params
        self.views = list(self.flat[: sum(sizes)].split(sizes)) if params else []
        # What each .grad becomes: its slice of the bucket, shaped as the parameter.
        self.grads = [v.view_as(p) for v, p in zip(self.views, params, strict=True)]
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
        self._params = list(params)
        self._views = False  # every .grad is its bucket view (after the first finish)
        last = self.buckets[-1].flat
        self._flags_at = last[-flags:]
        self._cuda = last.device.type == "cuda"
        if self._cuda:  # two pinned buffers in turn: the one written was read 2 steps ago
            self._host = [torch.zeros(flags, dtype=last.dtype, pin_memory=True) for _ in "ab"]
            self._copied = [torch.cuda.Event() for _ in "ab"]
            self._turn = 0
        else:  # the bucket itself, written through numpy
            self._host = [self._flags_at]
        self._host_np = [h.numpy() for h in self._host]
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in params]

    @property
    def flags_dtype(self) -> torch.dtype:
        return self.buckets[-1].flat.dtype

    def close(self) -> None:
        """Remove the hooks (the runtime is done with this group)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def zero_grad(self) -> None:
        """Zero the gradients for the next step: the buckets, once the ``.grad`` are their
        views; before that (the first step), as the optimizer's ``zero_grad`` does."""
        if self._views:
            for b in self.buckets:
                b.flat.zero_()
        else:
            for p in self._params:
                p.grad = None

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
        grad = bucket.grads[i]
        if p.grad is not grad:  # formed anew (the first step, or .grad was dropped)
            grad.copy_(p.grad)
            p.grad = grad
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
        the last bucket; wait (the sums are then in the ``.grad`` views). Returns the
        summed flags, on the device."""
        if not self._armed:
            self.arm()  # this rank had no sample in the step: it sends zeros
        self._armed = False
        for bucket in self.buckets[self._next :]:
            self._fill(bucket)
        if self._cuda:
            turn = self._turn
            self._copied[turn].synchronize()  # its copy two steps ago: long done
            self._host_np[turn][:] = flags
            self._flags_at.copy_(self._host[turn], non_blocking=True)
            self._copied[turn].record()
            self._turn = 1 - turn
        else:
            self._host_np[0][:] = flags
        for bucket in self.buckets[self._next :]:
            self._start(bucket)
        self._next = len(self.buckets)
        for bucket in self.buckets:  # the sums are in the .grad views when these return
            bucket.handle.wait()
            bucket.handle = None
        self._views = True
        return self._flags_at

    @staticmethod
    def _fill(bucket: _Bucket) -> None:
        for i, p in enumerate(bucket.params):
            if bucket.ready[i]:
                continue
            grad = bucket.grads[i]
            if p.grad is None:
                grad.zero_()
                p.grad = grad
            elif p.grad is not grad:  # formed in an earlier micro-step, no hook since
                grad.copy_(p.grad)
                p.grad = grad
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
