"""Slurm as a pool source: ``sinfo`` for node states, ``squeue --start`` and
``scontrol show res`` for the claims on idle nodes.

Facts this relies on (Slurm 22.05, see docs/slurm-local.md):

- ``sinfo -N -h -o '%N|%T'`` lists a node once per partition; an idle node that the
  backfill scheduler set aside for a pending job shows as ``planned``. ``sinfo --json``
  shows it as ``"state": "idle"`` with ``"state_flags": ["PLANNED"]``.
- ``squeue --start -t PD -o '%i|%P|%D|%S|%Y|%r'`` gives each pending job's planned start
  ``%S`` and planned nodes ``%Y`` (``(null)`` when not planned).
- ``scontrol show res -o`` gives one reservation per line (``StartTime``, ``Nodes``,
  ``State``), or ``No reservations in the system``.
- Times are read with ``SLURM_TIME_FORMAT=%s`` (epoch seconds), so the login node's
  time zone never matters.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TypeVar

from bftrainer.common.names import BadNameError, check_host
from bftrainer.idle_monitor.runner import CommandRunner
from bftrainer.idle_monitor.source import (
    Claims,
    CommandOutputError,
    NodeStates,
    OutputParseError,
    Scheduler,
    merge_claims,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

TIME_ENV = {"SLURM_TIME_FORMAT": "%s"}
SQUEUE_FORMAT = "%i|%P|%D|%S|%Y|%r"
_NO_VALUE = {"", "n/a", "(null)", "none", "unknown"}
# Flags on an idle node (JSON) that still allow using it. PLANNED is handled on its own.
_HARMLESS_FLAGS = frozenset({"CLOUD", "DYNAMIC_NORM"})


class HostlistError(ValueError):
    """A Slurm hostlist expression (``node[1-4,7]``) that does not parse; names it."""


# The most names one hostlist may expand to: ten times the largest machines' node
# counts. Checked by arithmetic on the ranges before any name is made, so that a reply
# naming 1e10 nodes is refused in one line instead of filling the memory.
MAX_HOSTLIST_NAMES = 1_000_000

# One name of a hostlist, parsed: its literal parts and its bracket groups, each group
# a list of (lo, hi, zero-padded width) ranges.
_Group = list[tuple[int, int, int]]


def expand_hostlist(text: str, max_names: int = MAX_HOSTLIST_NAMES) -> list[str]:
    """Expand a Slurm hostlist (``node[01-03],gpu[1-2]x``) into names, in order.

    Bracket groups may hold ranges (zero padding kept) and lists; several groups in one
    name expand as a product, as ``scontrol show hostnames`` does. ``HostlistError``
    when it does not parse, or when it would make more than ``max_names`` names
    (counted before expanding).
    """
    text = text.strip()
    if text.lower() in _NO_VALUE:
        return []
    items = [_parse_one(item, text) for item in _split_top(text, text)]
    total = 0
    for parts in items:
        total += math.prod(
            sum(hi - lo + 1 for lo, hi, _ in p) for p in parts if not isinstance(p, str)
        )
        if total > max_names:
            raise HostlistError(
                f"hostlist {_short(text)} names more than {max_names:,} nodes; refused "
                "before expanding it"
            )
    names: list[str] = []
    for parts in items:
        choices = [
            [p]
            if isinstance(p, str)
            else [f"{k:0{w}d}" for lo, hi, w in p for k in range(lo, hi + 1)]
            for p in parts
        ]
        names.extend("".join(chosen) for chosen in itertools.product(*choices))
    return names


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _split_top(text: str, whole: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' at {i} in hostlist {_short(whole)}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unmatched ']' at {i} in hostlist {_short(whole)}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"unclosed '[' in hostlist {_short(whole)}")
    items.append(text[start:])
    for item in items:
        if not item.strip():
            raise HostlistError(f"empty name in hostlist {_short(whole)}")
    return [i.strip() for i in items]


def _parse_one(item: str, whole: str) -> list[str | _Group]:
    """One name's literal parts and bracket groups, in order; nothing expanded."""
    parts: list[str | _Group] = []
    rest = item
    while True:
        m = re.search(r"\[([^\]]*)\]", rest)
        literal = rest if m is None else rest[: m.start()]
        if any(c in literal for c in "[] "):
            raise HostlistError(f"bad name {item!r} in hostlist {_short(whole)}")
        if literal:
            parts.append(literal)
        if m is None:
            return parts
        group: _Group = []
        for part in m.group(1).split(","):
            part = part.strip()
            lo_text, sep, hi_text = part.partition("-")
            if not lo_text.isdigit() or (sep and not hi_text.isdigit()):
                raise HostlistError(f"bad range {_short(part)} in hostlist {_short(whole)}")
            if max(len(lo_text), len(hi_text)) > 18:  # no node number has 19 digits
                raise HostlistError(f"number too long in hostlist {_short(whole)}")
            lo, hi = int(lo_text), int(hi_text) if sep else int(lo_text)
            if hi < lo:
                raise HostlistError(f"range {part!r} goes down in hostlist {_short(whole)}")
            width = len(lo_text) if lo_text.startswith("0") else 0
            group.append((lo, hi, width))
        parts.append(group)
        rest = rest[m.end() :]


def parse_time_s(text: str) -> float | None:
    """Epoch seconds from a Slurm time: digits (``SLURM_TIME_FORMAT=%s``), or the default
    ``YYYY-mm-ddTHH:MM:SS`` in this machine's local time; None for N/A and the like."""
    value = text.strip()
    if value.lower() in _NO_VALUE:
        return None
    if value.isdigit():
        return float(value)
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise OutputParseError(f"bad time {value!r}") from None


# ---------------------------------------------------------------------- sinfo


def classify_state(state: str) -> str:
    """``idle``, ``planned``, ``allocated`` or ``busy`` for a ``sinfo %T`` state.

    Only a plain ``idle`` is usable: a suffix flag (``idle*`` not responding, ``idle~``
    powered off, ``idle#`` powering up, ``idle$`` maintenance, ``idle@`` reboot, ...) or
    any other state (``drained``, ``reserved``, ``mixed``, ...) keeps the node out.
    ``allocated`` is told apart because a node allocated only to a job of a bftrainer
    partition (``bf``) still counts as idle for the main scheduler.
    """
    s = state.strip().lower()
    if s in ("idle", "planned", "allocated"):
        return s
    return "busy"


def _check_node(name: str, line_no: int | None, line: str | None) -> None:
    """A node name that can reach a command line (bftrainer.common.names), or the line refused."""
    try:
        check_host(name)
    except BadNameError as exc:
        raise OutputParseError(f"node name: {exc}", line_no, line) from None


def parse_sinfo_kinds(text: str) -> dict[str, str]:
    """Node -> ``classify_state`` kind from ``sinfo -N -h -o '%N|%T'`` (a node appears
    once per partition)."""
    nodes: dict[str, str] = {}
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise OutputParseError("expected 'NODE|STATE'", line_no, line)
        name, state = parts[0].strip(), parts[1].strip()
        _check_node(name, line_no, line)
        kind = classify_state(state)
        if name in nodes and nodes[name] != kind:
            # A node has one state; two different ones mean the output is not what we think.
            problem = f"node {name} listed as {nodes[name]} and {state}"
            raise OutputParseError(problem, line_no, line)
        nodes[name] = kind
    if not nodes:
        raise OutputParseError("no node lines in sinfo output")
    return nodes


def parse_sinfo_json_kinds(text: str, partitions: Sequence[str] = ()) -> dict[str, str]:
    """Node -> kind from ``sinfo --json`` (Slurm 21.08+): ``state`` plus ``state_flags``."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OutputParseError(f"not JSON: {exc.msg}", exc.lineno) from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise OutputParseError("JSON without a 'nodes' list")
    errors = data.get("errors") or []
    if errors:
        raise OutputParseError(f"sinfo reported errors: {errors!r:.200}")
    nodes: dict[str, str] = {}
    for i, node in enumerate(data["nodes"]):
        if not isinstance(node, dict) or not isinstance(node.get("name"), str):
            raise OutputParseError(f"node entry {i} has no name")
        _check_node(node["name"], None, None)
        if partitions and not set(node.get("partitions") or ()) & set(partitions):
            continue
        state = str(node.get("state", "")).lower()
        flags = {str(f).upper() for f in node.get("state_flags") or ()}
        if state == "allocated" and not flags - _HARMLESS_FLAGS:
            nodes[node["name"]] = "allocated"
        elif state != "idle" or flags - _HARMLESS_FLAGS - {"PLANNED"}:
            nodes[node["name"]] = "busy"
        else:
            nodes[node["name"]] = "planned" if "PLANNED" in flags else "idle"
    if not nodes:
        raise OutputParseError("no nodes in sinfo --json output")
    return nodes


def parse_sinfo(text: str, now_s: float) -> NodeStates:
    """Node states from ``sinfo -N -h -o '%N|%T'``."""
    return node_states(parse_sinfo_kinds(text), now_s)


def parse_sinfo_json(text: str, now_s: float, partitions: Sequence[str] = ()) -> NodeStates:
    """Node states from ``sinfo --json``."""
    return node_states(parse_sinfo_json_kinds(text, partitions), now_s)


def node_states(
    kinds: Mapping[str, str], now_s: float, held: frozenset[str] = frozenset()
) -> NodeStates:
    """``NodeStates`` from node kinds; ``allocated`` nodes in ``held`` count as idle."""
    return NodeStates(
        time_s=now_s,
        nodes=frozenset(kinds),
        idle=frozenset(
            n for n, k in kinds.items() if k == "idle" or (k == "allocated" and n in held)
        ),
        set_aside=frozenset(n for n, k in kinds.items() if k == "planned"),
    )


# ---------------------------------------------------------------------- GPUs


def gpu_count(gres: str) -> int:
    """The GPUs of a node's ``Gres`` as ``sinfo %G`` and ``scontrol show node`` print it:
    ``gpu:2``, ``gpu:tesla:2``, ``gpu:2(S:0-1)``, ``gpu:tesla:1,gpu:volta:1`` (2 in all),
    ``gpu`` (1); other resources (``mps:100``) count nothing; ``(null)`` or empty: 0.
    Raises ``ValueError`` naming what does not parse."""
    text = re.sub(r"\([^)]*\)", "", gres.strip())  # socket bindings: (S:0-1), (S:0,2)
    if text.lower() in _NO_VALUE:
        return 0
    total = 0
    for item in text.split(","):
        name, _, rest = item.strip().partition(":")
        if name != "gpu":
            continue
        count = rest.rpartition(":")[2] if rest else "1"
        if not count.isdigit():
            if rest and ":" not in rest and re.fullmatch(r"[A-Za-z][\w.\-]*", rest):
                count = "1"  # gpu:tesla, a type without a count: one
            else:
                raise ValueError(f"GPU count {count!r} in Gres {gres.strip()!r} is not a number")
        total += int(count)
    return total


def parse_sinfo_gpus(text: str) -> tuple[dict[str, int], dict[str, str]]:
    """GPUs per node from ``sinfo -N -h -o '%N|%G'``: the counts that parse, and for
    each node whose ``Gres`` does not, why (the other nodes still count)."""
    gpus: dict[str, int] = {}
    errors: dict[str, str] = {}
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, gres = line.partition("|")
        name = name.strip()
        if not sep:
            raise OutputParseError("expected 'NODE|GRES'", line_no, line)
        _check_node(name, line_no, line)
        try:
            gpus[name] = gpu_count(gres)
        except ValueError as exc:
            errors[name] = str(exc)
    if not gpus and not errors:
        raise OutputParseError("no node lines in sinfo output")
    return gpus, errors


def parse_running(text: str, bf_partitions: Sequence[str]) -> frozenset[str]:
    """Nodes held only by jobs of ``bf_partitions``, from ``squeue -h -t R -o '%P|%N'``.

    Such nodes are idle for the main scheduler: it preempts those jobs at will, and its
    plan (``squeue --start``) already includes the nodes, so their windows stay known.
    """
    own: set[str] = set()
    other: set[str] = set()
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        partition, sep, hostlist = line.partition("|")
        if not sep:
            raise OutputParseError("expected 'PARTITION|NODES'", line_no, line)
        try:
            nodes = expand_hostlist(hostlist)
        except HostlistError as exc:
            raise OutputParseError(str(exc), line_no, line) from None
        (own if partition.strip() in bf_partitions else other).update(nodes)
    return frozenset(own - other)


# ---------------------------------------------------------------------- claims


@dataclass(frozen=True)
class PendingJob:
    """A pending job as ``squeue --start`` shows it."""

    job_id: str
    partition: str
    num_nodes: int
    start_s: float | None
    planned_nodes: tuple[str, ...]
    reason: str


def parse_squeue_start(text: str) -> list[PendingJob]:
    """Pending jobs from ``squeue --start -h -o '%i|%P|%D|%S|%Y|%r'``."""
    jobs = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|", 5)
        if len(parts) != 6:
            raise OutputParseError(f"expected 6 fields '{SQUEUE_FORMAT}'", line_no, line)
        job_id, partition, count, start, planned, reason = (p.strip() for p in parts)
        if not count.isdigit():
            raise OutputParseError(f"bad node count {count!r}", line_no, line)
        try:
            start_s = parse_time_s(start)
            nodes = tuple(expand_hostlist(planned))
        except (OutputParseError, HostlistError) as exc:
            raise OutputParseError(str(exc), line_no, line) from None
        jobs.append(PendingJob(job_id, partition, int(count), start_s, nodes, reason))
    return jobs


@dataclass(frozen=True)
class Reservation:
    """A reservation as ``scontrol show res -o`` shows it."""

    name: str
    start_s: float
    end_s: float | None
    nodes: tuple[str, ...]
    state: str
    flags: frozenset[str]


def parse_reservations(text: str) -> list[Reservation]:
    """Reservations from ``scontrol show res -o`` (one ``Key=Value ...`` line each)."""
    out = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.strip().startswith("No reservations"):
            continue
        fields = dict(re.findall(r"(\w+)=(.*?)(?=\s+\w+=|\s*$)", line.strip()))
        if "ReservationName" not in fields or "StartTime" not in fields:
            raise OutputParseError("expected ReservationName=... StartTime=...", line_no, line)
        try:
            start_s = parse_time_s(fields["StartTime"])
            end_s = parse_time_s(fields.get("EndTime", ""))
            nodes = tuple(expand_hostlist(fields.get("Nodes", "")))
        except (OutputParseError, HostlistError) as exc:
            raise OutputParseError(str(exc), line_no, line) from None
        if start_s is None:
            raise OutputParseError("reservation without a start time", line_no, line)
        flags = frozenset(f for f in fields.get("Flags", "").split(",") if f)
        out.append(
            Reservation(
                fields["ReservationName"], start_s, end_s, nodes, fields.get("State", ""), flags
            )
        )
    return out


def job_claims(jobs: Iterable[PendingJob]) -> dict[str, float]:
    """Earliest planned start per node over the pending jobs that name their nodes."""
    return merge_claims(
        *({n: j.start_s for n in j.planned_nodes} for j in jobs if j.start_s is not None)
    )


def reservation_claims(reservations: Iterable[Reservation], now_s: float) -> dict[str, float]:
    """Start of the earliest reservation per node that has not ended."""
    return merge_claims(
        *(
            {n: r.start_s for n in r.nodes}
            for r in reservations
            if r.end_s is None or r.end_s > now_s
        )
    )


# ---------------------------------------------------------------------- the adapter


class SlurmScheduler(Scheduler):
    """Slurm through ``sinfo``, ``squeue --start`` and ``scontrol show res``.

    ``partitions`` restricts the node list (``sinfo -p``); claims are read from every
    partition, since any pending job can take an idle node it shares. ``use_json`` reads
    ``sinfo --json`` instead of the text format. ``bf_partitions`` names bftrainer's own
    preemptible partitions (``bf``): nodes held only by their jobs count as idle (one more
    ``squeue`` per poll). ``read_gpus``: also read the GPUs of those partitions' nodes
    (one more ``sinfo`` per poll), for ``--slots-per-node gres``.
    """

    name = "slurm"
    gpu_field = "Gres=gpu:N"

    def __init__(
        self,
        *,
        partitions: Sequence[str] = (),
        use_json: bool = False,
        bf_partitions: Sequence[str] = (),
        read_gpus: bool = False,
    ) -> None:
        for p in (*partitions, *bf_partitions):
            if not re.fullmatch(r"[A-Za-z0-9_.\-]+", p):
                raise ValueError(f"bad Slurm partition name {p!r}")
        self.partitions = tuple(partitions)
        self.use_json = use_json
        self.bf_partitions = tuple(bf_partitions)
        self.read_gpus = read_gpus

    def sinfo_argv(self) -> list[str]:
        if self.use_json:
            return ["sinfo", "--json"]
        argv = ["sinfo", "-N", "-h", "-o", "%N|%T"]
        if self.partitions:
            argv += ["-p", ",".join(self.partitions)]
        return argv

    def gres_argv(self) -> list[str]:
        """The GPUs of the nodes holders run on (the bf partitions), else of the pool's."""
        argv = ["sinfo", "-N", "-h", "-o", "%N|%G"]
        partitions = self.bf_partitions or self.partitions
        if partitions:
            argv += ["-p", ",".join(partitions)]
        return argv

    @staticmethod
    def squeue_argv() -> list[str]:
        return ["squeue", "--all", "--start", "-t", "PD", "-h", "-o", SQUEUE_FORMAT]

    @staticmethod
    def running_argv() -> list[str]:
        return ["squeue", "--all", "-t", "R", "-h", "-o", "%P|%N"]

    @staticmethod
    def scontrol_argv() -> list[str]:
        return ["scontrol", "show", "res", "-o"]

    def requirements(self, env: Callable[[str], str | None]) -> tuple[list[str], list[str]]:
        # A SLURM_CONF naming no file makes every command retry for its whole timeout
        # and then say only "timed out" (124 s at the defaults).
        conf = env("SLURM_CONF")
        return ["sinfo", "squeue", "scontrol"], [conf] if conf else []

    def read_nodes(self, runner: CommandRunner, now_s: float) -> NodeStates:
        argv = self.sinfo_argv()
        kinds: dict[str, str]
        if self.use_json:
            kinds = _parsed(runner, argv, lambda out: parse_sinfo_json_kinds(out, self.partitions))
        else:
            kinds = _parsed(runner, argv, parse_sinfo_kinds)
        held: frozenset[str] = frozenset()
        if self.bf_partitions and "allocated" in kinds.values():
            held = _parsed(
                runner, self.running_argv(), lambda out: parse_running(out, self.bf_partitions)
            )
        states = node_states(kinds, now_s, held)
        if self.read_gpus:
            gpus, errors = _parsed(runner, self.gres_argv(), parse_sinfo_gpus)
            states = replace(states, gpus=gpus, gpu_errors=errors)
        return states

    def read_claims(self, runner: CommandRunner, now_s: float) -> Claims:
        jobs = _parsed(runner, self.squeue_argv(), parse_squeue_start)
        reservations = _parsed(runner, self.scontrol_argv(), parse_reservations)
        claims = merge_claims(job_claims(jobs), reservation_claims(reservations, now_s))
        log.debug(
            "slurm: %d pending job(s), %d reservation(s), %d claimed node(s)",
            len(jobs),
            len(reservations),
            len(claims),
        )
        return Claims(now_s, claims)


def _parsed(runner: CommandRunner, argv: list[str], parse: Callable[[str], T]) -> T:
    result = runner.run(argv, env=TIME_ENV)
    try:
        return parse(result.stdout)
    except OutputParseError as exc:
        raise CommandOutputError(argv, runner.where, f"unparseable output: {exc}") from None
