"""One configuration record for the core loop and its policy, shared by ``replay`` and
``daemon``: defaults in one place, read from a TOML file, overridden by flags.

A file has a ``[policy]`` table with any of :class:`Config`'s fields::

    [policy]
    policy = "milp"            # milp | equal | scavenger (bftrainer.policies.registry.POLICIES)
    objective = "throughput"   # throughput | speedup | goodput
    formulation = "count"      # count | node
    solver = "highs"           # highs | cbc | gurobi | dp
    t_fwd_s = "auto"           # the allocator's look-ahead T_fwd, s; "auto": from the
                               # pool's churn (bftrainer/loop/churn.py)
    time_limit_s = 10.0        # solver limit per decision
    fairness_p = 1.0           # Pollux's fairness knob, -10..1
    fair_share_speedup = false
    fair_by = "trainer"        # trainer | user | account: whose shares fairness evens out
    fair_weights = { alice = 2.0, physics = 0.5 }  # with fair_by user or account; absent: 1
    max_trainers = 10          # P_jmax: trainers admitted at once
    redecide_every_s = 60.0    # a curve report re-decides at most this often (1e9: never)
    scavenger_size = 16        # the scavenger policy's rigid job size (omit: each job's n_max)

Other commands add their own tables (``replay``: ``window_hours``). Unknown tables or
keys and bad values are refused with one line naming the file, the key and the value.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from bftrainer.common.names import MAX_SLOTS
from bftrainer.milp import FORMULATIONS, SOLVERS
from bftrainer.milp.problem import (
    DEFAULT_MAX_TRAINERS,
    FAIR_BY,
    FAIR_WEIGHT_RANGE,
    FAIRNESS_P_RANGE,
    OBJECTIVES,
    T_FWD_MAX_S,
)

# The most trainers admitted at once (--max-parallel, max_trainers): exact as a float.
MAX_TRAINERS = 2**53

# The policies' names. The record checks them as it checks the solvers' and objectives'
# names; bftrainer.policies.registry builds each from this record (POLICIES, make_policy) and
# refuses to load if its registry and these names differ. The names live here, not
# there, so that the record imports neither the policies nor the loop.
POLICY_NAMES = ("milp", "equal", "scavenger")


class ConfigError(ValueError):
    """A configuration value is unknown or out of range; names the key and its origin."""


def _number(name: str, value: object, *, lo: float, lo_open: bool, allow_inf: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} = {value!r}: expected a number")
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise ConfigError(f"{name} = {value!r}: expected a finite number")
    if value < lo or (lo_open and value == lo):
        raise ConfigError(
            f"{name} = {value!r}: expected a number {'>' if lo_open else '>='} {lo:g}"
        )


def _choice(name: str, value: object, choices: tuple[str, ...] | list[str]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} = {value!r}: expected one of {', '.join(choices)}")


@dataclass(frozen=True)
class Config:
    """The loop's and the policy's settings (see the module docstring)."""

    policy: str = "milp"
    objective: str = "throughput"
    formulation: str = "count"
    solver: str = "highs"
    t_fwd_s: float | str = "auto"  # seconds, or "auto" (bftrainer/loop/churn.py)
    time_limit_s: float = 10.0
    fairness_p: float = 1.0
    fair_share_speedup: bool = False
    # Fairness between trainers, users or accounts (docs/allocator.md, "Fair by user or
    # account"), and each user's or account's weight (absent: 1).
    fair_by: str = "trainer"
    fair_weights: Mapping[str, float] = field(default_factory=dict)
    max_trainers: int = DEFAULT_MAX_TRAINERS
    redecide_every_s: float = 60.0
    # The scavenger baseline's rigid size for every job, within its [n_min, n_max];
    # None: each job's n_max (bftrainer/policies/registry.py, ScavengerPolicy).
    scavenger_size: int | None = None
    # S: slots (GPUs) per pool node, the unit of allocation (docs/allocator.md, "Slots").
    # Set by the replay ([replay], --slots-per-node) and the daemon ([daemon],
    # --slots-per-node: a number, or "gres" read from the nodes' GPUs,
    # bftrainer/daemon/gpu_slots.py).
    slots_per_node: int = 1

    def __post_init__(self) -> None:
        _choice("policy", self.policy, POLICY_NAMES)
        _choice("objective", self.objective, OBJECTIVES)
        _choice("formulation", self.formulation, FORMULATIONS)
        _choice("solver", self.solver, SOLVERS)
        if isinstance(self.t_fwd_s, int) and not isinstance(self.t_fwd_s, bool):
            object.__setattr__(self, "t_fwd_s", float(self.t_fwd_s))  # TOML's 120
        if self.t_fwd_s != "auto":
            if isinstance(self.t_fwd_s, str):
                raise ConfigError(f't_fwd_s = {self.t_fwd_s!r}: expected "auto" or seconds')
            # 0 values every allocation at nothing: no trainer would ever start.
            _number("t_fwd_s", self.t_fwd_s, lo=0.0, lo_open=True, allow_inf=False)
            if self.t_fwd_s > T_FWD_MAX_S:
                raise ConfigError(
                    f't_fwd_s = {self.t_fwd_s!r}: expected "auto" or a number <= {T_FWD_MAX_S:g}'
                )
        # --time-limit's limit: a solver cannot be run and stopped in less.
        _number("time_limit_s", self.time_limit_s, lo=0.01, lo_open=False, allow_inf=False)
        _number(
            "fairness_p", self.fairness_p, lo=FAIRNESS_P_RANGE[0], lo_open=False, allow_inf=False
        )
        if self.fairness_p > FAIRNESS_P_RANGE[1]:
            raise ConfigError(
                f"fairness_p = {self.fairness_p!r}: expected a number in "
                f"[{FAIRNESS_P_RANGE[0]:g}, {FAIRNESS_P_RANGE[1]:g}]"
            )
        if not isinstance(self.fair_share_speedup, bool):
            raise ConfigError(
                f"fair_share_speedup = {self.fair_share_speedup!r}: expected true or false"
            )
        _choice("fair_by", self.fair_by, FAIR_BY)
        if not isinstance(self.fair_weights, Mapping):
            raise ConfigError(
                f"fair_weights = {self.fair_weights!r}: expected a table of user or account "
                "= weight"
            )
        lo, hi = FAIR_WEIGHT_RANGE
        for name, weight in self.fair_weights.items():
            _number(f"fair_weights.{name}", weight, lo=lo, lo_open=False, allow_inf=False)
            if weight > hi:
                raise ConfigError(f"fair_weights.{name} = {weight!r}: expected a number <= {hi:g}")
        if isinstance(self.max_trainers, bool) or not isinstance(self.max_trainers, int):
            raise ConfigError(f"max_trainers = {self.max_trainers!r}: expected a whole number")
        if not 1 <= self.max_trainers <= MAX_TRAINERS:
            raise ConfigError(
                f"max_trainers = {self.max_trainers!r}: expected a whole number from 1 to "
                f"{MAX_TRAINERS} (2**53, --max-parallel's limit)"
            )
        # Finite, as --redecide-every: inf was kept, and recorded as null (issue 42).
        _number("redecide_every_s", self.redecide_every_s, lo=0.0, lo_open=False, allow_inf=False)
        size = self.scavenger_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ConfigError(f"scavenger_size = {size!r}: expected a whole number >= 1")
        slots = self.slots_per_node
        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= MAX_SLOTS:
            raise ConfigError(
                f"slots_per_node = {slots!r}: expected a whole number from 1 to {MAX_SLOTS} "
                "(--slots-per-node's limit)"
            )
        if slots > 1 and self.policy == "scavenger":
            raise ConfigError(
                f"slots_per_node = {slots}: the scavenger baseline runs whole nodes (1 slot)"
            )


C = TypeVar("C", bound=Config)
# Table name -> {key in the file: field of the record}. A command that reads more
# tables (the replay's [replay], the daemon's own) passes them with these.
POLICY_TABLES: dict[str, dict[str, str]] = {
    "policy": {f.name: f.name for f in fields(Config) if f.name != "slots_per_node"}
}


def load_config(path: Path, base: C, tables: Mapping[str, Mapping[str, str]] = POLICY_TABLES) -> C:
    """``base`` with the values of ``path``'s tables, each key mapped to a field by
    ``tables``. Unknown tables and keys, and bad values, raise :class:`ConfigError`
    naming the file, table and key."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except ValueError as e:  # e.g. an integer of more than 4,300 digits
        raise ConfigError(f"{path}: not a usable TOML value: {e}") from None
    config = base
    for name, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: key {name!r} is outside a table (expected {_list(tables)})")
        if name not in tables:
            raise ConfigError(f"{path}: unknown table [{name}] (expected {_list(tables)})")
        keys = tables[name]
        for key, value in table.items():
            if key not in keys:
                raise ConfigError(f"{path}: [{name}] unknown key {key!r} (expected {_list(keys)})")
            config = _set(config, keys[key], value, f"{path}: [{name}] ")
    return config


def given_fields(path: Path, tables: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The fields ``path`` sets, each with where (``path: [table] key``): of a file
    :func:`load_config` has read without error."""
    data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    return {
        tables[name][key]: f"{path}: [{name}] {key}"
        for name, table in data.items()
        for key in table
    }


# In ``refuse_unused``'s needs: the other field set (not None), to any value.
ANY = "<any value>"
# The policy's own: weights are per user or account, so by trainer they would be ignored.
POLICY_NEEDS: dict[str, tuple[str, Any, str]] = {
    "fair_weights": ("fair_by", ("user", "account"), 'fair_by = "user" or "account" (--fair-by)'),
}


def refuse_unused(
    config: Any,
    given: Mapping[str, str],
    needs: Mapping[str, tuple[str, Any, str]],
) -> None:
    """A setting that means nothing without another refused in one line (issue 42: it was
    accepted and ignored). ``given``: field -> where it was set (a flag, a file's key);
    ``needs``: field -> (the field it needs; the value it needs, a tuple of values, or
    ``ANY``; how to set it)."""
    for name in sorted(given):
        if name not in needs:
            continue
        other, value, how = needs[name]
        have = getattr(config, other)
        if value == ANY:
            unmet = have is None
        elif isinstance(value, tuple):
            unmet = have not in value
        else:
            unmet = have != value
        if unmet:
            raise ConfigError(f"{given[name]} means nothing without {how}")


def with_overrides(base: C, values: Mapping[str, Any], names: Mapping[str, str] | None = None) -> C:
    """``base`` with each value given (not None), e.g. from flags; ``names`` maps a field
    to the flag that set it, for errors."""
    config = base
    for field_name, value in values.items():
        if value is not None:
            origin = (names or {}).get(field_name, field_name)
            config = _set(config, field_name, value, f"{origin}: ")
    return config


def _set(config: C, field_name: str, value: Any, prefix: str) -> C:
    current = getattr(config, field_name)
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)  # TOML's 120 for 120.0
    try:
        return replace(config, **{field_name: value})
    except ConfigError as e:
        raise ConfigError(f"{prefix}{e}") from None


def _list(names: Iterable[str]) -> str:
    return ", ".join(names)
