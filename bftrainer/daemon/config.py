"""The daemon's settings: the loop's ``[policy]`` and the daemon's own ``[daemon]``.

What a user sets and how it is checked, apart from the machinery that uses it: the CLI
reads and checks it (``daemon``, ``centre``) before anything runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from bftrainer.common.promise import promise_error
from bftrainer.daemon.live_driver import RESTART_BACKOFF_S
from bftrainer.policies.config import (
    POLICY_NEEDS,
    POLICY_TABLES,
    Config,
    ConfigError,
    given_fields,
    load_config,
    refuse_unused,
    with_overrides,
)
from bftrainer.policies.registry import LIVE_POLICIES

GRES = "gres"  # slots_per_node read from the scheduler's GPU counts


MAX_HOLDER_LEASE_S = 7 * 86400.0


@dataclass(frozen=True)
class DaemonConfig(Config):
    """The loop's settings (``[policy]``) and the daemon's own (``[daemon]``)."""

    poll_interval_s: float = 10.0
    report_every_s: float = 5.0
    # How long a holder outlives the last renewal of its lease (by the daemon at each
    # poll, by a trainer's supervisor while it runs there): the bound on how long a node
    # stays held for nobody when the daemon is gone.
    holder_lease_s: float = 300.0
    # A supervisor that died is started again after restart_backoff_s * 2**k seconds
    # for its k-th restart (bftrainer.daemon.live_driver).
    restart_backoff_s: float = RESTART_BACKOFF_S
    # Centre mode (bftrainer.centre): how often agents sync with the allocator, and how
    # long an agent may stay silent before the allocator gives its trainers' nodes away.
    sync_every_s: float = 1.0
    agent_lease_s: float = 60.0
    # A node assigned to a user and not held by that user's agent within hold_grace_s is
    # refused to that user for refused_for_s (bftrainer.centre.refusals).
    hold_grace_s: float = 120.0
    refused_for_s: float = 600.0
    # Opt-in metrics (bftrainer.service.metrics, docs/deployment.md): a node_exporter
    # textfile (a path ending in .prom) and/or an HTTP port on 127.0.0.1. None: off.
    metrics_textfile: str | None = None
    metrics_port: int | None = None
    # slots_per_node = "gres" (the flag or [daemon]): S is read at start from the GPUs
    # of the bf partition's nodes (bftrainer/daemon/gpu_slots.py); slots_per_node is then 1
    # until the daemon has read it.
    gpu_slots: bool = False
    # Promise (docs/hpo.md): milp weighs a search trial's objective term by
    # search_promise ** (the rungs its campaign marked), as [replay] search_promise does;
    # 1 (the default) is off: every weight 1.
    search_promise: float = 1.0

    def __post_init__(self) -> None:
        if self.slots_per_node == GRES:
            object.__setattr__(self, "slots_per_node", 1)
            object.__setattr__(self, "gpu_slots", True)
        super().__post_init__()
        promise = promise_error(self.search_promise)
        if promise is not None:
            raise ConfigError(promise)
        port = self.metrics_port
        if port is not None and (
            isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535
        ):
            raise ConfigError(f"metrics_port = {port!r}: expected a port number, 1 to 65535")
        textfile = self.metrics_textfile
        if textfile is not None and (
            not isinstance(textfile, str) or not textfile.endswith(".prom")
        ):
            raise ConfigError(
                f"metrics_textfile = {textfile!r}: expected a file name ending in .prom "
                "(node_exporter's textfile collector reads only those)"
            )
        for name in (
            "poll_interval_s",
            "report_every_s",
            "holder_lease_s",
            "restart_backoff_s",
            "sync_every_s",
            "agent_lease_s",
            "hold_grace_s",
            "refused_for_s",
        ):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0.1
            ):
                raise ConfigError(f"{name} = {value!r}: expected a finite number >= 0.1 (seconds)")
        if self.holder_lease_s > MAX_HOLDER_LEASE_S:
            # A lease this long is none: the holder's shell could not even read the time
            # it ends at (1e300 s was taken, and held nodes for nobody as if unleased).
            raise ConfigError(
                f"holder_lease_s = {self.holder_lease_s!r}: expected at most "
                f"{MAX_HOLDER_LEASE_S:.0f} s (a week): it bounds how long a node stays held "
                "for nobody once the daemon is gone"
            )
        if self.poll_interval_s > self.holder_lease_s / 2:
            # The daemon renews a spare held node's lease at a poll once half of it is
            # gone: a longer poll let the lease lapse, and the holder end, between two.
            raise ConfigError(
                f"poll_interval_s = {self.poll_interval_s!r}: expected at most half the "
                f"holder lease ({self.holder_lease_s:g} s): the daemon renews its holders' "
                "leases at its polls"
            )


_POLICY_FIELDS = {f.name for f in fields(Config)}
# The TOML tables a daemon reads: the loop's [policy] and its own [daemon] (with the
# loop's slots_per_node: trainers share a held node's slots, docs/deployment.md).
DAEMON_TABLES = {
    **POLICY_TABLES,
    "daemon": {
        **{
            f.name: f.name
            for f in fields(DaemonConfig)
            if f.name not in _POLICY_FIELDS and f.name != "gpu_slots"  # slots_per_node = "gres"
        },
        "slots_per_node": "slots_per_node",
    },
}


def load_daemon_config(
    path: Path | None, overrides: Mapping[str, object], names: Mapping[str, str] | None = None
) -> DaemonConfig:
    """The daemon's settings: defaults, then the TOML file's, then ``overrides`` (those not
    None; ``names`` maps a field to the flag that set it, for errors)."""
    config = DaemonConfig()
    if path is not None:
        config = load_config(path, config, DAEMON_TABLES)
    config = with_overrides(config, overrides, names)
    if path is not None:  # the flags set no field that needs another
        refuse_unused(config, given_fields(path, DAEMON_TABLES), POLICY_NEEDS)
    textfile = config.metrics_textfile
    if textfile is not None:  # as --metrics-textfile: a file, not a folder
        where = f"{path}: " if path is not None and not overrides.get("metrics_textfile") else ""
        if Path(textfile).is_dir():
            raise ConfigError(f"{where}metrics_textfile = {textfile!r}: is a folder, not a file")
    if config.policy not in LIVE_POLICIES:
        where = f"{path}: " if path is not None else ""
        raise ConfigError(
            f"{where}policy = {config.policy!r}: the daemon runs {' or '.join(LIVE_POLICIES)} "
            "(the others are replay baselines)"
        )
    if config.search_promise != 1 and config.policy != "milp":
        where = f"{path}: [daemon] " if path is not None else ""
        raise ConfigError(
            f"{where}search_promise = {config.search_promise!r} means nothing without "
            f"policy = milp (policy = {config.policy!r} weighs no trainer)"
        )
    return config
