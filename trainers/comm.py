"""The in-worker backend seam: collectives and elastic-reset semantics per backend.

Three implementations of :class:`Comm`:

* :class:`SingleComm`: one process, no launcher (``python trainer.py``);
* :class:`TorchDistComm`: a worker started by ``torchrun`` (``env://``; NCCL for a
  model on a GPU, gloo for one on the CPU and for the small object collectives). Every
  membership change or failure restarts all workers; they resume from the checkpoint
  on disk, so :meth:`Comm.run` simply calls the training function once;
* :class:`HorovodComm`: Elastic Horovod. :meth:`run` wraps the training function in
  ``hvd.elastic.run`` with a :class:`~horovod.common.elastic.State` whose save/restore/
  sync are the runtime's snapshot functions: a worker failure rolls the survivors back
  to the last in-memory commit, a host change is noticed at a step boundary and turned
  into a commit followed by a reset, and new workers get the state of the most advanced
  rank by broadcast.

The runtime (:mod:`bftrainer.trainers.runtime`) only talks to this interface; torch and
Horovod are imported when a backend is chosen. Gradients reach :meth:`Comm.allreduce_sum_async`
on the model's device (:mod:`bftrainer.trainers.reducer`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

BACKENDS = ("single", "torchrun", "horovod")
# How long a preempted Horovod worker waits for its shut-down with the others: under a
# second when they agree; a main job waits for the process to be gone.
LEAVE_SHUTDOWN_S = 2.0
# How a Horovod worker waits for an operation: asleep, 50 us at first, doubling up to 1 ms
# (at most a millisecond past its end). Horovod 0.28's own wait spins on sched_yield for
# as long as the operation takes, a negotiation cycle at least: on a CPU node the waiting
# worker takes the core its peers and its data loading need.
HOROVOD_POLL_FIRST_S, HOROVOD_POLL_MAX_S = 50e-6, 1e-3


class BackendError(RuntimeError):
    """A backend that cannot be used here (names it and why)."""


class CommLostError(RuntimeError):
    """A collective failed because a peer went away: the backend restarts the workers."""


class WorkerLeaving(RuntimeError):
    """This worker got SIGTERM (its node is being taken back, e.g. a Slurm preemption):
    it has committed with the others and now exits alone; the survivors go on from that
    commit. Not a user error: the worker wrapper exits 143 without a failure record."""


class ElasticState(Protocol):
    """What the runtime gives a backend: snapshot, load, and the step for sync's root."""

    def snapshot(self) -> dict[str, Any]: ...

    def load_snapshot(self, snap: dict[str, Any]) -> None: ...

    def sync_key(self) -> int: ...

    def rollback(self, saved: dict[str, Any]) -> None:
        """Go back to the last commit after a failed collective (``saved`` is the
        in-memory copy of the last commit this rank completed)."""
        ...


class Pending(Protocol):
    """A started all-reduce; ``wait`` returns when its result may be used (on a GPU
    stream: when work queued after it sees the result)."""

    def wait(self) -> Any: ...


class Comm(Protocol):
    backend: str

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def local_size(self) -> int: ...

    def allreduce_sum_async(self, tensor: torch.Tensor, name: str) -> Pending:
        """Start summing ``tensor`` in place over the ranks (``name``: the same on every
        rank, unique among the sums in flight)."""
        ...

    def broadcast_object(self, obj: Any, root: int = 0) -> Any: ...

    def allgather_object(self, obj: Any) -> list[Any]: ...

    def run(self, train: Callable[[], Any], state: ElasticState) -> Any: ...

    def commit(self) -> None: ...

    def regroup(self) -> None:
        """Another rank left at this step, after the common commit: re-form without it
        before the next collective (or let that collective fail, where it fails fast)."""
        ...

    def leave(self) -> None:
        """This rank leaves at this step, after the common commit: let the others know
        (bounded: the process exits right after, and a main job waits for it)."""
        ...

    @property
    def hosts_updated(self) -> bool: ...


def sync_from_most_advanced(comm: Comm, state: ElasticState) -> None:
    """Make every rank's state the one of the rank with the highest ``sync_key``.

    New processes hold the checkpoint on disk (or nothing); survivors of a reset hold
    their live or last committed state. Picking the most advanced (lowest rank on ties)
    does not depend on which process Horovod or torchrun made rank 0. The root sends
    its tensors from host memory: pickled from its GPU they would land on that GPU on
    every rank (or fail where it is not visible); each rank's ``load_state_dict`` puts
    them on its own device.
    """
    if comm.size == 1:
        return
    keys = comm.allgather_object(state.sync_key())
    root = max(range(len(keys)), key=lambda r: (keys[r], -r))
    snap = comm.broadcast_object(to_cpu(state.snapshot()) if comm.rank == root else None, root)
    if comm.rank != root:
        state.load_snapshot(snap)


def to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor in it copied to host memory (containers rebuilt)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu")
    if isinstance(obj, dict):
        return type(obj)((k, to_cpu(v)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return type(obj)(*(to_cpu(v) for v in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


class _Done:
    """A collective that had nothing to wait for."""

    def wait(self) -> None:
        return None


class SingleComm:
    """One process: collectives are identities; a run is one call."""

    backend = "single"
    rank = 0
    size = 1
    local_size = 1
    hosts_updated = False

    def allreduce_sum_async(self, tensor: torch.Tensor, name: str) -> Pending:
        return _Done()

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        return obj

    def allgather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def run(self, train: Callable[[], Any], state: ElasticState) -> Any:
        return train()

    def commit(self) -> None:
        return None

    def regroup(self) -> None:
        return None

    def leave(self) -> None:
        return None


class _TorchPending:
    """A torch.distributed work handle whose failure is a lost peer."""

    def __init__(self, work: Any) -> None:
        self._work = work

    def wait(self) -> None:
        try:
            self._work.wait()
        except RuntimeError as e:
            raise CommLostError(f"all_reduce failed: {e}") from e


class TorchDistComm:
    """A torchrun worker: the process group from the environment torchrun sets.

    A model on a GPU gets ``cpu:gloo,cuda:nccl``: its gradients go through NCCL, the
    object collectives (commits, the state at a reset) through gloo on the CPU, where
    the objects are. The group is bound to the worker's GPU (``device_id``), so NCCL
    makes its one communicator as the group forms instead of at the first step.
    """

    backend = "torchrun"
    hosts_updated = False

    def __init__(self, device: torch.device | None = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        cuda = device is not None and device.type == "cuda"
        if not dist.is_initialized():
            try:
                if cuda:
                    dist.init_process_group("cpu:gloo,cuda:nccl", device_id=device)
                else:
                    dist.init_process_group("gloo")
            except RuntimeError as e:  # DistNetworkError, DistStoreError: a peer went away
                # The group's store lives in rank 0's worker: when its node is preempted
                # while the others join, they lose it. The backend starts a new group;
                # the trainer's script did nothing wrong.
                raise CommLostError(f"joining the group failed: {e}") from e
        self._rank = dist.get_rank()
        self._size = dist.get_world_size()
        self._local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    @property
    def local_size(self) -> int:
        return self._local_size

    def allreduce_sum_async(self, tensor: torch.Tensor, name: str) -> Pending:
        try:
            return _TorchPending(self._dist.all_reduce(tensor, async_op=True))
        except RuntimeError as e:
            raise CommLostError(f"all_reduce failed: {e}") from e

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        box = [obj]
        try:
            self._dist.broadcast_object_list(box, src=root)
        except RuntimeError as e:
            raise CommLostError(f"broadcast failed: {e}") from e
        return box[0]

    def allgather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self._size
        try:
            self._dist.all_gather_object(out, obj)
        except RuntimeError as e:
            raise CommLostError(f"all_gather failed: {e}") from e
        return out

    def run(self, train: Callable[[], Any], state: ElasticState) -> Any:
        sync_from_most_advanced(self, state)
        try:
            return train()
        finally:
            self._dist.destroy_process_group()

    def commit(self) -> None:
        return None

    def regroup(self) -> None:
        # The next all_reduce fails at once on the closed connection (CommLostError),
        # and torchrun restarts every worker on the hosts that remain.
        return None

    def leave(self) -> None:
        return None


class HorovodComm:
    """An Elastic Horovod worker (``horovodrun --host-discovery-script``)."""

    backend = "horovod"

    def __init__(self, device: torch.device | None = None) -> None:
        try:
            import horovod.torch as hvd
        except ImportError as e:
            raise BackendError(
                f"backend horovod: cannot import horovod.torch ({e}); build it with "
                "scripts/build-horovod.sh (make horovod)"
            ) from e
        self._hvd = hvd
        if device is not None and device.type == "cuda":
            # Without it, hvd.synchronize waits for the GPU at every bucket: with it, the
            # wait is queued on the stream, as NCCL's in torch.distributed is.
            os.environ.setdefault("HOROVOD_ENABLE_ASYNC_COMPLETION", "1")
        hvd.init()
        self._state: Any = None
        # GPU tensors go to Horovod as they are where it was built with GPU operations
        # (NCCL); otherwise they pass through a pinned host copy.
        self._staged = device is not None and device.type == "cuda" and not _gpu_ops(hvd)

    @property
    def rank(self) -> int:
        return int(self._hvd.rank())

    @property
    def size(self) -> int:
        return int(self._hvd.size())

    @property
    def local_size(self) -> int:
        return int(self._hvd.local_size())

    def allreduce_sum_async(self, tensor: torch.Tensor, name: str) -> Pending:
        # Horovod matches the ranks' tensors by name: a bucket's name is the same on
        # every rank, and a step waits for all its buckets before the next one starts.
        hvd = self._hvd
        if not self._staged:
            handle = hvd.allreduce_async_(tensor, op=hvd.Sum, name=f"bftrainer.{name}")
            return _HorovodPending(hvd, handle, None)
        host = tensor.to("cpu").pin_memory()
        handle = hvd.allreduce_async_(host, op=hvd.Sum, name=f"bftrainer.{name}")
        return _HorovodPending(hvd, handle, (host, tensor))

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        # One name on every rank: Horovod names it after type(obj) by default, and only
        # the root passes the object (the others None), so the names would differ.
        return self._hvd.broadcast_object(obj, root_rank=root, name="bftrainer.object")

    def allgather_object(self, obj: Any) -> list[Any]:
        return list(self._hvd.allgather_object(obj, name="bftrainer.gather"))

    @property
    def hosts_updated(self) -> bool:
        """A host-change notification has arrived here (agreed on by the caller)."""
        return bool(self._state is not None and self._state.update_pending)

    def commit(self) -> None:
        """Save in memory, then raise ``HostsUpdatedInterrupt`` if hosts changed."""
        self._state.commit()
        # No interrupt: this rank's notifications were drained and rank 0 saw nothing
        # newer (a stale one), so stop asking for a commit at every step.
        self._state.update_pending = False

    def regroup(self) -> None:
        """Reset now (shut down, then join the new ring), as for a host change, together
        with the leaver's own shut-down (``leave``)."""
        from horovod.common.exceptions import HostsUpdatedInterrupt

        raise HostsUpdatedInterrupt(False)  # False: sync the state after the reset

    def leave(self) -> None:
        """Shut Horovod down with the others (``regroup``) before exiting. A rank that
        exits without it breaks its peers' background loops in mid-cycle: one lost its
        loop ("Connection reset by peer") with its connections still open, and the others
        waited out Gloo's whole timeout for it (tests/trainers/test_elastic_horovod.py)."""
        down = threading.Thread(target=self._hvd.shutdown, daemon=True)
        down.start()
        down.join(LEAVE_SHUTDOWN_S)

    def run(self, train: Callable[[], Any], state: ElasticState) -> Any:
        self._state = horovod_state(self, state)
        run = self._hvd.elastic.run(lambda _state: train())
        return run(self._state)


def horovod_state(comm: HorovodComm, state: ElasticState) -> Any:
    """Horovod's elastic ``State`` for ``state``: commits and syncs through it, and host
    notifications flag ``update_pending`` for the runtime's step flags.

    Horovod drops the notifications that reach a worker while it resets (``on_reset``
    empties the queue). A host added then, say a second after a host removed, was never
    used: the driver had told the workers once, and they never reset for it (a trainer
    stayed on 2 nodes of 4 until its work was done). Those are kept: a notification no
    newer than rank 0's last is ignored by ``check_host_updates`` anyway, and one the
    reset already covered costs one more reset, not a lost grow.
    """
    from horovod.common.elastic import State

    class _State(State):
        def __init__(self) -> None:
            super().__init__(bcast_object=comm._hvd.broadcast_object, get_rank=comm._hvd.rank)
            self.update_pending = False
            self._saved = state.snapshot()

        def on_hosts_updated(self, timestamp: float, update_res: Any) -> None:
            self.update_pending = True
            super().on_hosts_updated(timestamp, update_res)

        def on_reset(self) -> None:
            arrived = self._host_messages  # type: ignore[has-type]  # (during the reset: above)
            super().on_reset()
            self._host_messages = arrived
            self.update_pending = not arrived.empty()

        def save(self) -> None:
            self._saved = state.snapshot()

        def restore(self) -> None:
            state.rollback(self._saved)

        def sync(self) -> None:
            sync_from_most_advanced(comm, state)
            self._saved = state.snapshot()

    return _State()


def _gpu_ops(hvd: Any) -> bool:
    """Horovod was built with GPU all-reduce (NCCL) here."""
    try:
        return bool(hvd.nccl_built()) or bool(hvd.cuda_built())
    except AttributeError:
        return False


class _HorovodPending:
    def __init__(self, hvd: Any, handle: Any, staged: tuple[Any, Any] | None) -> None:
        self._hvd, self._handle, self._staged = hvd, handle, staged

    def wait(self) -> None:
        pause_s = HOROVOD_POLL_FIRST_S
        while not self._hvd.poll(self._handle):
            time.sleep(pause_s)
            pause_s = min(2 * pause_s, HOROVOD_POLL_MAX_S)
        self._hvd.synchronize(self._handle)  # done: the result, or the operation's error
        if self._staged is not None:
            host, tensor = self._staged
            tensor.copy_(host, non_blocking=True)


def detect_backend() -> str:
    """The backend of this process: ``BFTRAINER_BACKEND``, else what the launcher set."""
    name = os.environ.get("BFTRAINER_BACKEND")
    if name:
        if name not in BACKENDS:
            raise BackendError(f"BFTRAINER_BACKEND={name!r}: expected one of {BACKENDS}")
        return name
    if "HOROVOD_RANK" in os.environ or "HOROVOD_HOSTNAME" in os.environ:
        return "horovod"
    if "TORCHELASTIC_RUN_ID" in os.environ or "WORLD_SIZE" in os.environ:
        return "torchrun"
    return "single"


def make_comm(backend: str | None = None, device: torch.device | None = None) -> Comm:
    """The backend's comm for a model on ``device`` (NCCL where it is a GPU)."""
    name = backend or detect_backend()
    if name == "horovod":
        return HorovodComm(device)
    if name == "torchrun":
        return TorchDistComm(device)
    if name == "single":
        return SingleComm()
    raise BackendError(f"unknown backend {name!r}; expected one of {BACKENDS}")
