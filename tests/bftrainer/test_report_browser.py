"""The report as a person sees it, in a real headless Chromium (Debian's ``chromium``;
.ci/run installs it as root): it loads with no console error, every image decodes,
and a screenshot of the page is not blank; a replay of several policies opens with
them side by side."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import matplotlib.image
import numpy as np
import pytest

from bftrainer.report.figures import PALETTE
from tests.bftrainer.chromium import Chromium, find_chromium
from tests.bftrainer.test_frames import build_store
from tests.bftrainer.test_report_compare import POLICIES, replay_policies

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


def look_at(page: Path, shot: Path, layout: str = "null") -> Any:
    """Check the page in Chromium; the value of the JavaScript ``layout`` there, and
    the screenshot's pixels, for a test to check further."""
    assert CHROMIUM is not None
    with Chromium(CHROMIUM) as browser:
        browser.open(page)
        images = browser.evaluate(
            "Promise.all(Array.from(document.images).map("
            "  i => i.decode().then(() => [i.naturalWidth, i.naturalHeight],"
            "                       () => [0, 0])))"
        )
        errors = browser.console_errors()
        seen = browser.evaluate(layout)
        png = browser.screenshot()
    shot.write_bytes(png)
    assert errors == []
    assert len(images) >= 4
    assert all(w > 100 and h > 100 for w, h in images), images
    pixels = matplotlib.image.imread(io.BytesIO(png))[..., :3]
    assert pixels.shape[0] > 900  # the whole page, not the first screen
    ink = np.mean(pixels.min(axis=2) < 0.9)  # the share of pixels that are not white
    assert ink > 0.02, f"the screenshot is blank ({ink:.1%} ink)"
    # Colours, not a flat page: each pixel's colour to 2 decimals as one integer (a 1-D
    # unique takes a second where one over rows of three took most of the test).
    levels = np.rint(pixels * 100).astype(np.int32)
    assert len(np.unique((levels[..., 0] * 101 + levels[..., 1]) * 101 + levels[..., 2])) > 20
    return seen, pixels


def shots_dir(tmp_path: Path) -> Path:
    d = Path(os.environ.get(SHOTS_ENV, tmp_path))
    d.mkdir(parents=True, exist_ok=True)
    return d


# Where the opening's figure and table are, as laid out: boxes in CSS pixels from the top.
OPENING = """(() => {
  const box = e => { const r = e.getBoundingClientRect();
                     return [r.left, r.top, r.width, r.height]; };
  const fig = document.querySelector('figure'), table = document.querySelector('table');
  return {
    figure: box(fig.querySelector('img')),
    caption: fig.querySelector('figcaption').textContent,
    table: box(table),
    heads: Array.from(table.querySelectorAll('thead th')).map(th => th.textContent),
    rows: Array.from(table.querySelectorAll('tbody th')).map(th => th.textContent),
    sections: Array.from(document.querySelectorAll('h2')).map(h => [h.textContent, box(h)[1]]),
  };
})()"""


def test_a_replays_report_in_chromium(tmp_path: Path) -> None:
    """Three policies, as ``make demo`` runs them: the page opens with the comparison
    figure, drawn in each policy's colour, then its table, then the sections."""
    replay_policies(tmp_path / "out")
    page = write_report(str(tmp_path / "out"))
    seen, pixels = look_at(page, shots_dir(tmp_path) / "replay-report.png", OPENING)
    (first, first_top), *sections = seen["sections"]
    assert first == "The policies side by side"
    tops = dict(sections)
    assert sorted(tops) == sorted(POLICIES)
    left, top, width, height = seen["figure"]
    assert first_top < top and width > 600 and height > 300  # drawn, not a broken image
    assert top + height <= seen["table"][1] < min(tops.values())
    assert all(p in seen["caption"] for p in POLICIES)
    assert sorted(seen["heads"][1:]) == sorted(POLICIES)
    assert {"U (A_e / A_s)", "rescale cost, samples", "trainers done"} <= set(seen["rows"])
    drawn = pixels[round(top) : round(top + height), round(left) : round(left + width)]
    for colour in PALETTE[: len(POLICIES)]:  # each policy's line, on screen
        rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)]) / 255
        near = np.abs(drawn - rgb).max(axis=2) < 0.08
        assert near.sum() > 200, colour


def test_a_daemons_report_in_chromium(tmp_path: Path) -> None:
    build_store(tmp_path / "state")
    page = write_report("--state-dir", str(tmp_path / "state"), "--out", str(tmp_path / "rep"))
    look_at(page, shots_dir(tmp_path) / "daemon-report.png")
