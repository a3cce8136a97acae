"""The report as a person sees it, in a real headless Chromium (Debian's ``chromium``;
.ci/run installs it as root): it loads with no console error, every image decodes,
and a screenshot of the page is not blank."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from tests.bftrainer.chromium import Chromium, find_chromium
from tests.bftrainer.test_frames import build_store, run_replay

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium here (Debian's `chromium` package; .ci/run installs it as root)",
)
# Where to keep the screenshots for a person to look at (default: the test's tmp_path).
SHOTS_ENV = "BFTRAINER_SCREENSHOTS"


def write_report(*args: str) -> Path:
    r = subprocess.run(
        [sys.executable, "-m", "bftrainer", "report", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(r.stdout.strip())


def look_at(page: Path, shot: Path) -> None:
    assert CHROMIUM is not None
    with Chromium(CHROMIUM) as browser:
        browser.open(page)
        images = browser.evaluate(
            "Promise.all(Array.from(document.images).map("
            "  i => i.decode().then(() => [i.naturalWidth, i.naturalHeight],"
            "                       () => [0, 0])))"
        )
        errors = browser.console_errors()
        png = browser.screenshot()
    shot.write_bytes(png)
    assert errors == []
    assert len(images) >= 4
    assert all(w > 100 and h > 100 for w, h in images), images
    pixels = matplotlib.image.imread(io.BytesIO(png))[..., :3]
    assert pixels.shape[0] > 900  # the whole page, not the first screen
    ink = np.mean(pixels.min(axis=2) < 0.9)  # the share of pixels that are not white
    assert ink > 0.02, f"the screenshot is blank ({ink:.1%} ink)"
    assert len(np.unique(pixels.reshape(-1, 3).round(2), axis=0)) > 20  # colours, not a flat page


def shots_dir(tmp_path: Path) -> Path:
    d = Path(os.environ.get(SHOTS_ENV, tmp_path))
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_a_replays_report_in_chromium(tmp_path: Path) -> None:
    run_replay(tmp_path / "out", "--policy", "milp,equal")  # a page of two runs
    page = write_report(str(tmp_path / "out"))
    look_at(page, shots_dir(tmp_path) / "replay-report.png")


def test_a_daemons_report_in_chromium(tmp_path: Path) -> None:
    build_store(tmp_path / "state")
    page = write_report("--state-dir", str(tmp_path / "state"), "--out", str(tmp_path / "rep"))
    look_at(page, shots_dir(tmp_path) / "daemon-report.png")
