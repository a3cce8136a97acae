"""The trainer directory's files: the only channel between a trainer and its driver.

Compute nodes and the login node share a filesystem and no inbound port is open, so a
trainer reports by appending JSON lines to ``metrics.jsonl`` and writing ``result.json``
once; its driver (the daemon or ``bftrainer run``) writes ``hosts`` and ``exec.json``;
the supervisor writes ``exit.json``. Whole-file writes are atomic (tmp + fsync +
rename); appends are flushed and fsynced, and a reader skips a torn last line and
resumes from a byte offset. docs/trainers.md, "The trainer directory (the reporting
channel)", lists every file and who writes it.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bftrainer.common.names import (
    BadNameError,
    NotRegularFileError,
    check_host,
    check_slots,
    read_text,
)
from bftrainer.trainers.checkpoint import write_atomic

if TYPE_CHECKING:  # numpy comes with it: `bftrainer status` reads this module, not them
    from bftrainer.trainers.metrics import MetricsRecord

logger = logging.getLogger(__name__)

HOSTS = "hosts"
EXEC = "exec.json"
METRICS = "metrics.jsonl"
RESULT = "result.json"
EXIT = "exit.json"
SPEC = "spec.json"
CHECKPOINT = "checkpoint.pt"
SUPERVISOR_PID = "supervisor.pid"
SUPERVISOR_LOG = "supervisor.log"
STOP_REQUEST = "stop.request"  # the supervisor asks the workers to checkpoint and exit
# The supervisor's copy of the hosts that Horovod's discovery reads (never empty).
DISCOVERY_HOSTS = "discovery-hosts"
# The environment variable naming that file to the Horovod driver (launch/horovod_driver.py).
DISCOVERY_HOSTS_VARIABLE = "BFTRAINER_DISCOVERY_HOSTS"
EXEC_MODES = ("local", "ssh", "slurm")


class ChannelError(ValueError):
    """A trainer-directory file that cannot be read (names the file and line)."""


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (see :func:`checkpoint.write_atomic`)."""
    data = text.encode()
    write_atomic(path, lambda f: f.write(data))


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, sort_keys=True, allow_nan=False) + "\n")


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``; None when the file does not exist."""
    try:
        text = read_text(Path(path))  # a FIFO in its place: refused, never waited on
    except FileNotFoundError:
        return None
    except (NotRegularFileError, BadNameError) as e:
        raise ChannelError(str(e.strerror if isinstance(e, OSError) else e)) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ChannelError(f"{path}:{e.lineno}: not JSON: {e.msg}") from None


# -- hosts ---------------------------------------------------------------------------


def parse_hosts(text: str, source: str = "<hosts>") -> list[tuple[str, int]]:
    """``host[:slots]`` lines (blank lines and ``#`` comments ignored) as (host, slots).
    A host listed twice (in any letter case) is refused: each line starts one agent, and
    two agents on one host never agree on a rendezvous (``host:slots`` gives a host more
    slots)."""
    out: list[tuple[str, int]] = []
    first_line: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host, sep, slots_text = line.partition(":")
        try:
            check_host(host)
            slots = check_slots(slots_text) if sep else 1
        except BadNameError as e:
            raise ChannelError(
                f"{source}:{lineno}: expected 'host' or 'host:slots', got {raw[:120]!r}: {e}"
            ) from None
        key = host.lower()  # host names are not case-sensitive: LOCALHOST is localhost
        if key in first_line:
            raise ChannelError(
                f"{source}:{lineno}: host {host!r} is listed twice (first at line "
                f"{first_line[key]}): list each host once, as 'host:slots' for more slots"
            )
        first_line[key] = lineno
        out.append((host, slots))
    return out


def format_hosts(hosts: Sequence[str | tuple[str, int]]) -> str:
    """One ``host:slots`` line per host (slots 1 unless given as ``host:slots``)."""
    lines = []
    for h in hosts:
        if isinstance(h, tuple):
            lines.append(f"{h[0]}:{h[1]}")
        else:
            (host, slots), *_ = parse_hosts(h, "<host list>") or [("", 0)]
            if not host:
                raise ChannelError(f"empty host name in {list(hosts)!r}")
            lines.append(f"{host}:{slots}")
    return "".join(f"{line}\n" for line in lines)


def write_hosts(trainer_dir: Path, hosts: Sequence[str | tuple[str, int]]) -> None:
    """Rewrite ``hosts`` atomically; ``[]`` means zero hosts (checkpoint and stop)."""
    write_text_atomic(Path(trainer_dir) / HOSTS, format_hosts(hosts))


def read_hosts(trainer_dir: Path) -> list[tuple[str, int]]:
    """The trainer's current hosts; [] when the file is empty or absent."""
    path = Path(trainer_dir) / HOSTS
    try:
        text = read_text(path)
    except FileNotFoundError:
        return []
    except NotRegularFileError as e:
        raise ChannelError(str(e.strerror)) from None
    except BadNameError as e:
        raise ChannelError(str(e)) from None
    return parse_hosts(text, str(path))


# -- exec.json -----------------------------------------------------------------------


def write_exec(
    trainer_dir: Path,
    mode: str,
    slurm_jobs: Mapping[str, str] | None = None,
    ssh_args: Sequence[str] = (),
    leases: Mapping[str, str] | None = None,
    lease_s: float | None = None,
    slots: Mapping[str, Sequence[int]] | None = None,
    slots_per_node: int = 1,
) -> None:
    """How to run a command on a host (see :func:`read_exec`); ``leases``: each host's
    holder lease file, which the supervisor renews for ``lease_s`` while it runs there;
    ``slots``: when trainers share nodes (``slots_per_node`` > 1), the trainer's slots of
    each host in the order it got them (a worker of local rank r runs on the r-th,
    bftrainer.trainers.launch.slot_pin)."""
    if mode not in EXEC_MODES:
        raise ChannelError(f"exec mode must be one of {EXEC_MODES}, got {mode!r}")
    data: dict[str, Any] = {"mode": mode, "slurm_jobs": dict(slurm_jobs or {})}
    if ssh_args:
        data["ssh_args"] = list(ssh_args)
    if leases:
        data["leases"] = dict(leases)
        data["lease_s"] = lease_s
    if slots_per_node > 1:
        data["slots"] = {h: list(s) for h, s in (slots or {}).items()}
        data["slots_per_node"] = slots_per_node
    write_json_atomic(Path(trainer_dir) / EXEC, data)


def read_exec(trainer_dir: Path) -> dict[str, Any] | None:
    """``{"mode", "slurm_jobs", "ssh_args", "leases", "lease_s"}`` and, when trainers
    share nodes, ``"slots"`` and ``"slots_per_node"``; None when there is no exec.json."""
    path = Path(trainer_dir) / EXEC
    data = read_json(path)
    if data is None:
        return None
    if not isinstance(data, dict) or data.get("mode") not in EXEC_MODES:
        raise ChannelError(f"{path}: expected {{'mode': one of {EXEC_MODES}, ...}}, got {data!r}")
    jobs = data.get("slurm_jobs") or {}
    ssh_args = data.get("ssh_args") or []
    if not isinstance(jobs, dict) or not isinstance(ssh_args, list):
        raise ChannelError(f"{path}: slurm_jobs must be an object, ssh_args a list")
    leases = data.get("leases") or {}
    lease_s = data.get("lease_s")
    if not isinstance(leases, dict) or not (
        lease_s is None or (isinstance(lease_s, int | float) and lease_s > 0)
    ):
        raise ChannelError(f"{path}: leases must be an object, lease_s a positive number")
    slots = data.get("slots") or {}
    per_node = data.get("slots_per_node", 1)
    if (
        not isinstance(slots, dict)
        or isinstance(per_node, bool)
        or not isinstance(per_node, int)
        or per_node < 1
        or not all(
            isinstance(s, list)
            and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < per_node for i in s)
            for s in slots.values()
        )
    ):
        raise ChannelError(
            f"{path}: slots must map each host to slot numbers below slots_per_node "
            f"(a whole number >= 1), got {slots!r} and {per_node!r}"
        )
    out = {
        "mode": data["mode"],
        "slurm_jobs": jobs,
        "ssh_args": [str(a) for a in ssh_args],
        "leases": {str(h): str(p) for h, p in leases.items()},
        "lease_s": lease_s,
    }
    if "slots" in data:
        out["slots"] = {str(h): list(s) for h, s in slots.items()}
        out["slots_per_node"] = per_node
    return out


# -- holder leases -------------------------------------------------------------------


def renew_lease(path: str | Path, until_s: float) -> None:
    """Keep a holder job for ``until_s`` (epoch s): its sleeping task ends the holder
    once that time passes (scripts/slurm/hold-nodes.sbatch). Written by the daemon for
    every live holder and by each supervisor for its own hosts, so a holder that serves
    nobody ends by itself, even when the daemon is gone."""
    write_text_atomic(Path(path), f"{int(until_s)}\n")


# -- metrics.jsonl, result.json (written by rank 0) ----------------------------------


class ChannelWriter:
    """Rank 0's side: appends records to ``metrics.jsonl``, writes ``result.json``."""

    def __init__(self, trainer_dir: Path, clock: Any = None) -> None:
        import time

        self.trainer_dir = Path(trainer_dir)
        self.trainer_dir.mkdir(parents=True, exist_ok=True)
        self._clock = clock or time.time

    def _append(self, obj: Mapping[str, Any]) -> None:
        line = json.dumps(obj, sort_keys=True, allow_nan=False) + "\n"
        with open(self.trainer_dir / METRICS, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def metrics(self, record: MetricsRecord, samples_done: int, epoch: int) -> None:
        self._append(
            {
                "kind": "metrics",
                "record": record.to_dict(),
                "samples_done": samples_done,
                "epoch": epoch,
                "time_s": self._clock(),
            }
        )

    def reset(
        self,
        nodes: int,
        batch_size: int,
        local_bsz: int,
        accum_steps: int,
        lr: float,
        **extra: Any,
    ) -> None:
        self._append(
            {
                "kind": "reset",
                "time_s": self._clock(),
                "nodes": nodes,
                "batch_size": batch_size,
                "local_bsz": local_bsz,
                "accum_steps": accum_steps,
                "lr": lr,
                **extra,
            }
        )

    def report(self, value: float, samples_done: int, step: int, trial: str | None) -> None:
        """One value of the trainer's own metric (``runtime.report``), keyed by the
        samples it had seen: what a search's pruner compares (docs/hpo.md)."""
        self._append(
            {
                "kind": "report",
                "value": value,
                "samples_done": samples_done,
                "step": step,
                "trial": trial,
                "time_s": self._clock(),
            }
        )

    def result(self, result: Mapping[str, Any]) -> None:
        write_json_atomic(self.trainer_dir / RESULT, dict(result))


def read_metrics(trainer_dir: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Records appended since byte ``offset``, and the offset to read from next time.

    A last line without its newline is being written (or was torn by a crash): it is
    left for the next call. A complete line that is not JSON is skipped with a warning.
    """
    path = Path(trainer_dir) / METRICS
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    records: list[dict[str, Any]] = []
    for line in data[:end].splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            logger.warning("%s: skipping a line that is not JSON: %.80r", path, line)
            continue
        if isinstance(obj, dict):
            records.append(obj)
    return records, offset + end


def read_reports(trainer_dir: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The ``report`` records (``runtime.report``) appended since byte ``offset``, each
    checked: ``{"value": finite float, "samples_done": int >= 0, ...}``; a malformed one
    is skipped with a warning (it cannot be a value the trainer meant)."""
    records, end = read_metrics(trainer_dir, offset)
    out = []
    for rec in records:
        if rec.get("kind") != "report":
            continue
        value, samples = rec.get("value"), rec.get("samples_done")
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and isinstance(samples, int)
            and samples >= 0
        ):
            out.append(rec)
        else:
            logger.warning("%s: skipping a malformed report: %.120r", trainer_dir, rec)
    return out, end


def read_result(trainer_dir: Path) -> dict[str, Any] | None:
    """``result.json`` (the work is done) or None."""
    data = read_json(Path(trainer_dir) / RESULT)
    if data is not None and not isinstance(data, dict):
        raise ChannelError(f"{Path(trainer_dir) / RESULT}: expected an object, got {data!r}")
    return data


# -- exit.json (written by the supervisor) -------------------------------------------


# Why a trainer failed: its own script raised (``script``); its restart budget is spent
# (``restarts``: lost over and over without a new commit, launch/restarts.py); or what
# runs it gave up (``infrastructure``: a host unreachable, the supervisor's own error). A
# driver may start an infrastructure failure again from its checkpoint, within the budget.
EXIT_CAUSES = ("script", "restarts", "infrastructure")


def write_exit(
    trainer_dir: Path,
    state: str,
    returncode: int | None,
    reason: str,
    time_s: float,
    cause: str | None = None,
) -> None:
    """``cause`` (one of ``EXIT_CAUSES``) is written for a failure only."""
    if state not in ("done", "failed", "stopped"):
        raise ChannelError(f"exit state must be done, failed or stopped, got {state!r}")
    data: dict[str, Any] = {
        "state": state,
        "returncode": returncode,
        "reason": reason,
        "time_s": time_s,
    }
    if state == "failed":
        if cause not in EXIT_CAUSES:
            raise ChannelError(f"a failure's cause must be one of {EXIT_CAUSES}, got {cause!r}")
        data["cause"] = cause
    write_json_atomic(Path(trainer_dir) / EXIT, data)


def read_exit(trainer_dir: Path) -> dict[str, Any] | None:
    """``exit.json`` ({"state", "returncode", "reason", "time_s"}) or None."""
    path = Path(trainer_dir) / EXIT
    data = read_json(path)
    if data is None:
        return None
    if not isinstance(data, dict) or data.get("state") not in ("done", "failed", "stopped"):
        raise ChannelError(f"{path}: expected {{'state': done|failed|stopped, ...}}, got {data!r}")
    return data
