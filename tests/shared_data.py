"""Where the evaluation data lies: ``../shared/data`` beside the repository, or
``$BFTRAINER_SHARED_DATA``. It is never shipped; tests that use it skip when absent."""

from __future__ import annotations

import os
from pathlib import Path

SHARED = Path(
    os.environ.get("BFTRAINER_SHARED_DATA")
    or Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
)
