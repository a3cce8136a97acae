"""How a trainer's workers reach their nodes: the daemon's exec plan, written to each
trainer's ``exec.json`` (``docs/trainers.md``) before its supervisor is told its hosts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from bftrainer.trainers import channel


@dataclass(frozen=True)
class ExecPlan:
    """How the trainers' workers reach their nodes: ``mode`` of ``exec.json``, in
    ``slurm`` mode the holder job of each node, and each node's holder lease (which the
    supervisor renews for ``lease_s`` while it runs there); when trainers share nodes,
    the trainer's slots of each node (``bftrainer/daemon/slot_book.py``)."""

    mode: str
    jobs: Mapping[str, str]
    leases: Mapping[str, str] = field(default_factory=dict)
    lease_s: float | None = None
    slots: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    slots_per_node: int = 1

    def on(self, nodes: Sequence[str]) -> ExecPlan:
        """This plan for ``nodes`` only: their holders and leases."""
        return replace(
            self,
            jobs={n: self.jobs[n] for n in nodes if n in self.jobs},
            leases={n: self.leases[n] for n in nodes if n in self.leases},
        )

    def reachable(self, nodes: Sequence[str]) -> tuple[str, ...]:
        """``nodes`` that workers can run on now: in slurm mode, those with a holder."""
        return tuple(nodes) if self.mode != "slurm" else tuple(n for n in nodes if n in self.jobs)

    def write(self, trainer_dir: Path) -> None:
        channel.write_exec(
            trainer_dir,
            self.mode,
            self.jobs,
            leases=self.leases,
            lease_s=self.lease_s,
            slots=self.slots,
            slots_per_node=self.slots_per_node,
        )


# Workers run on this machine by the nodes' names (tests, and trainers run by hand).
LOCAL = ExecPlan("local", {})
