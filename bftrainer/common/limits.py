"""Limits of the allocator's input that code outside ``milp/`` applies too.

A learned curve is capped at the largest value the allocator accepts, so that what a
trainer measured never makes its own input refused. The limit lives here, in the leaf,
so that capping a curve (``bftrainer status`` does, for every trainer it shows) does
not import the allocator and numpy with it: ``milp/problem.py`` imports it from here.
"""

from __future__ import annotations

# The largest curve value (samples/s) the allocator accepts: docs/allocator.md, "Limits".
CURVE_VALUE_MAX = 1e12
