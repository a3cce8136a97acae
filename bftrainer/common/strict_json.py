"""Strict JSON for every output: JSON has no NaN or Infinity, so a non-finite float is
written as ``null`` and ``json.dumps`` runs with ``allow_nan=False`` (a bare ``Infinity``
in ``status --json`` broke the readers that follow the standard)."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every non-finite float, at any depth, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``finite(value)``, strictly (keyword arguments as json.dumps)."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)
