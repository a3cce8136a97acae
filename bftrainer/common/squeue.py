"""The one reader of ``squeue``'s job lines: the state of bftrainer's holder jobs.

Two processes ask Slurm about the same holder jobs: the daemon, for the state of all its
holders (:mod:`bftrainer.holders.slurm`), and each trainer's supervisor, for whether its
hosts' holders still run (:mod:`bftrainer.trainers.launch.hostwatch`). Both ask for the
fields here and read the reply with :func:`parse_squeue_jobs`, so they never read one
reply two ways. What each concludes from a job stays with it. A leaf module: the
supervisor imports it without the daemon's scheduler machinery.

Facts this relies on (Slurm 22.05.8 of scripts/slurm/local-cluster.sh, measured; see
docs/holders.md): ``squeue -O 'JobID:|,...'`` prints each field unpadded and
untruncated, each followed by ``|``. ``ReqNodes`` holds the ``-w`` node even while
pending, when ``NodeList`` is empty. ``PreemptTime`` is epoch seconds with
``SLURM_TIME_FORMAT=%s`` (``N/A`` otherwise); it is set the moment Slurm preempts, while
the job may still show ``RUNNING``: from then on the node is not ours.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FIELDS = ("JobID", "State", "ReqNodes", "NodeList", "PreemptTime", "Reason")
# The value of squeue's --Format (-O) for FIELDS.
FORMAT = ",".join(f"{f}:|" for f in FIELDS)
# squeue's environment: times as epoch seconds.
TIME_ENV = {"SLURM_TIME_FORMAT": "%s"}
# What Slurm prints for a field without a value.
NO_VALUE = frozenset({"", "n/a", "none", "(null)", "unknown"})


def has_value(text: str) -> bool:
    """Whether a field holds a value (not ``N/A``, ``None``, ``(null)``, ...)."""
    return text.strip().lower() not in NO_VALUE


@dataclass(frozen=True)
class SqueueJob:
    """One job as ``squeue -O FORMAT`` lists it, each field as printed (stripped)."""

    job_id: str
    state: str  # RUNNING, PENDING, COMPLETED, ...
    req_nodes: str
    node_list: str
    preempt_time: str
    reason: str
    line_no: int = field(default=0, compare=False)  # in the reply, for errors

    @property
    def preempted(self) -> bool:
        """Slurm preempted the job (whatever its state shows now)."""
        return has_value(self.preempt_time)

    @property
    def hostlist(self) -> str:
        """The job's nodes as a Slurm hostlist: allocated, else requested (pending)."""
        return self.node_list if has_value(self.node_list) else self.req_nodes


def parse_squeue_jobs(text: str) -> list[SqueueJob]:
    """The jobs of ``squeue -h -O FORMAT``, in the order listed; ``ValueError`` naming
    the line for a line that is not ``FIELDS`` each ended by ``|``."""
    out: list[SqueueJob] = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != len(FIELDS) + 1 or parts[-1] or not parts[0]:
            raise ValueError(f"line {line_no}: expected {'|'.join(FIELDS)}|: {line!r}")
        job_id, state, req_nodes, node_list, preempt_time, reason = parts[:-1]
        out.append(SqueueJob(job_id, state, req_nodes, node_list, preempt_time, reason, line_no))
    return out
