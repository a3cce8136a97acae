"""The runtime's elastic state: its snapshot, a rollback to a commit, a resume from disk.

A base class of :class:`bftrainer.trainers.runtime.ElasticRuntime`, apart from its loop:
what a checkpoint holds (``snapshot``) and how a process gets back to it. The
attributes it reads are the runtime's, declared here.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

from bftrainer.trainers.agent import PolluxAgent
from bftrainer.trainers.checkpoint import CheckpointError, CheckpointWriter, load_checkpoint
from bftrainer.trainers.runtime_options import RuntimeConfigError
from bftrainer.trainers.runtime_state import RunProgress
from bftrainer.trainers.sampler import ElasticSampler

logger = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1


class RuntimeSnapshots:
    """Snapshot, load, rollback and resume of the runtime's state (see the runtime)."""

    model: Any
    optimizer: Any
    sampler: ElasticSampler
    agent: PolluxAgent
    grad_scaler: Any | None
    progress: RunProgress
    trainer_id: str
    _pending: list[tuple[int, list[int]]]
    _lr_factor_set: float | None
    _writer: CheckpointWriter | None
    _checkpoint: Path
    _reuse_snapshot: dict[str, Any] | None

    def snapshot(self) -> dict[str, Any]:
        """Everything a rollback or a new process needs (deep copies). Within a commit,
        the one its checkpoint took: Horovod's in-memory copy needs no second one."""
        if self._reuse_snapshot is not None:
            return self._reuse_snapshot
        p = self.progress
        return {
            "version": CHECKPOINT_VERSION,
            "trainer_id": self.trainer_id,
            "model": copy.deepcopy(self.model.state_dict()),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "sampler": self.sampler.state_dict(),
            "agent": copy.deepcopy(self.agent.state()),
            "scaler": None if self.grad_scaler is None else self.grad_scaler.state_dict(),
            "progress": p.to_dict(),
        }

    def load_snapshot(self, snap: dict[str, Any]) -> None:
        self.model.load_state_dict(snap["model"])
        self.optimizer.load_state_dict(snap["optimizer"])
        self._lr_factor_set = None  # the loaded groups carry the LR of the snapshot
        self.sampler.load_state_dict(snap["sampler"])
        self.agent.restore(copy.deepcopy(snap["agent"]))
        if self.grad_scaler is not None and snap.get("scaler"):
            self.grad_scaler.load_state_dict(snap["scaler"])
        self.progress = RunProgress.from_dict(snap["progress"])
        self._pending = []

    def sync_key(self) -> int:
        return self.progress.step

    def rollback(self, saved: dict[str, Any]) -> None:
        """Load ``saved``, or the checkpoint on disk when that is newer.

        A peer can die after rank 0 wrote a commit's checkpoint but before every rank
        kept it in memory: the commit is durable, so the survivors resume from it
        rather than from the commit before (costing at most the steps since it).
        """
        self._wait_for_disk()
        disk = load_checkpoint(self._checkpoint)
        if (
            disk is not None
            and disk.get("trainer_id") == self.trainer_id
            and int(disk["progress"]["step"]) > int(saved["progress"]["step"])
        ):
            logger.info(
                "rollback to the checkpoint's step %d, newer than the in-memory commit's %d",
                disk["progress"]["step"],
                saved["progress"]["step"],
            )
            saved = disk
        self.load_snapshot(saved)

    def _wait_for_disk(self) -> None:
        """Let the checkpoint in flight land (a failed write leaves the one before)."""
        if self._writer is not None:
            try:
                self._writer.wait()
            except CheckpointError as e:
                logger.warning("%s", e)

    def _load_from_disk(self) -> None:
        snap = load_checkpoint(self._checkpoint)
        if snap is None:
            return
        if snap.get("trainer_id") != self.trainer_id:
            raise RuntimeConfigError(
                f"{self._checkpoint}: checkpoint of trainer {snap.get('trainer_id')!r}, "
                f"not {self.trainer_id!r}"
            )
        self.load_snapshot(snap)
        logger.info("resumed from %s at step %d", self._checkpoint, self.progress.step)
