"""matplotlib's pyplot, imported at the first plot rather than with the module that draws.

Importing pyplot costs about a second of CPU. A command that fails on its input, or
writes no plot, should not pay it: `bftrainer replay` on a bad log paid it before
saying one line.
"""

from __future__ import annotations

from types import ModuleType


def agg_pyplot() -> ModuleType:
    """pyplot on the Agg backend (PNG files, no display on a login or compute node)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
