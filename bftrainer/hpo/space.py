"""A search space from the command line, and a trial's parameters as a script's options.

``--param lr=float:1e-4:1e-1:log``, ``--param hidden=int:16:256``, ``--param
act=cat:relu,tanh`` become Optuna distributions; a trial's parameters reach the trainer
script as its options, ``--lr 0.003 --hidden 64 --act relu`` (docs/hpo.md): the script
declares them with argparse as it would for a run by hand.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}\Z")
# The runtime's options that say which trainer a run is (trainers/runtime_options.py): the
# campaign writes --trial NAME#K after the parameters, and a parameter of that name would
# come first, so the trial could not be found again; the trainer's folder and id are the
# daemon's.
RESERVED = frozenset({"trial", "trainer-dir", "trainer-id"})
INT_MAX = 2**53


class SpaceError(ValueError):
    """A ``--param`` that does not parse, named with what was expected."""


def parse_param(text: str) -> tuple[str, BaseDistribution]:
    """``name=float:LOW:HIGH[:log]``, ``name=int:LOW:HIGH[:log]`` or ``name=cat:A,B,...``."""
    name, sep, spec = text.partition("=")
    if not sep or not NAME.match(name):
        raise SpaceError(
            f"--param {text!r}: expected NAME=float:LOW:HIGH[:log], NAME=int:LOW:HIGH[:log] "
            "or NAME=cat:A,B,... with NAME a letter then letters, digits, _ or -"
        )
    check_name(name)
    kind, _, rest = spec.partition(":")
    if kind == "cat":
        choices = [c for c in rest.split(",") if c]
        if not choices:
            raise SpaceError(f"--param {text!r}: cat needs at least one choice")
        twice = next((c for i, c in enumerate(choices) if c in choices[:i]), None)
        if twice is not None:  # the sampler would weigh it twice
            raise SpaceError(f"--param {text!r}: choice {twice!r} is given twice")
        return name, CategoricalDistribution(choices)
    parts = rest.split(":")
    if kind not in ("float", "int") or len(parts) not in (2, 3):
        raise SpaceError(f"--param {text!r}: expected {name}=float|int:LOW:HIGH[:log] or cat:")
    log = len(parts) == 3
    if log and parts[2] != "log":
        raise SpaceError(f"--param {text!r}: the third field may only be 'log'")
    try:
        low, high = (float(p) if kind == "float" else int(p) for p in parts[:2])
    except ValueError:
        raise SpaceError(f"--param {text!r}: LOW and HIGH must be {kind}s") from None
    if not (math.isfinite(low) and math.isfinite(high)) or low > high or (log and low <= 0):
        raise SpaceError(f"--param {text!r}: need LOW <= HIGH (and LOW > 0 with log)")
    if kind == "int" and max(abs(low), abs(high)) > INT_MAX:
        # Optuna's database keeps values as doubles: a larger int comes back changed.
        raise SpaceError(f"--param {text!r}: ints within +-2**53 (the study keeps doubles)")
    if kind == "int":
        return name, IntDistribution(int(low), int(high), log=log)
    return name, FloatDistribution(float(low), float(high), log=log)


def check_name(name: str) -> None:
    """A parameter may not be one of the runtime's options that name the trainer."""
    if name in RESERVED:
        raise SpaceError(
            f"parameter {name!r}: --{name} is the runtime's own option, which the campaign "
            "and the daemon set; name the parameter otherwise"
        )


def parse_space(texts: Sequence[str]) -> dict[str, BaseDistribution]:
    space: dict[str, BaseDistribution] = {}
    for text in texts:
        name, dist = parse_param(text)
        if name in space:
            raise SpaceError(f"--param {name} is given twice")
        space[name] = dist
    return space


def as_args(params: Mapping[str, Any]) -> list[str]:
    """A trial's parameters as the script's options, in name order."""
    out: list[str] = []
    for name, value in sorted(params.items()):
        out += [f"--{name}", repr(value) if isinstance(value, float) else str(value)]
    return out
