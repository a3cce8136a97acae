"""The folders install as one namespace: nothing generic lands top-level in site-packages."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_PREFIX = "bftrainer/idle_monitor/fixtures/"
# setuptools' note on every editable install with a package-dir mapping ("Editable
# installation. Please be careful with folders..."): information, not a fault of ours.
EDITABLE_NOTE = "BuildBackendWarning: Editable installation."
HOLDER_SCRIPTS = (
    "bftrainer/scripts/slurm/hold-nodes.sbatch",
    "bftrainer/scripts/lsf/bsub-hold.lsf",
)
FOLDERS = {
    "bftrainer": "bftrainer",
    "milp": "bftrainer.milp",
    "idle_monitor": "bftrainer.idle_monitor",
    "trainers": "bftrainer.trainers",
    "scripts/slurm": "bftrainer.scripts.slurm",  # the holder job scripts (package data)
    "scripts/lsf": "bftrainer.scripts.lsf",
}


def source_copy(tmp_path: Path) -> Path:
    """The files a commit would carry, copied: setuptools writes build/ and egg-info into
    the tree it builds, and two builds in one tree at once fail (two pytest-xdist workers
    did: "Directory not empty: build/bdist.linux-x86_64/wheel")."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    src = tmp_path / "src"
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # a file deleted but not yet committed is listed too
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    return src


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = set()
    for folder, name in FOLDERS.items():
        # A folder of data (idle_monitor/fixtures) is a package to setuptools too: unlisted,
        # pip warns and the wheel may leave it out.
        for sub in [ROOT / folder, *(ROOT / folder).rglob("*")]:
            if sub.is_dir() and sub.name != "__pycache__" and any(sub.iterdir()):
                found.add(".".join((name, *sub.relative_to(ROOT / folder).parts)))
    assert found == listed


@pytest.mark.slow
def test_wheel_installs_under_one_namespace_in_a_fresh_venv(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path)],
        cwd=source_copy(tmp_path),
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("bftrainer-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"bftrainer", wheel.name.split("-py3")[0] + ".dist-info"}
    fixtures = {p.name for p in (ROOT / "idle_monitor" / "fixtures").iterdir()}
    shipped = {n.rsplit("/", 1)[1] for n in names if n.startswith(FIXTURE_PREFIX)}
    assert fixtures == shipped, "the wheel carries every recorded scheduler output"
    assert set(HOLDER_SCRIPTS) <= set(names), "the wheel carries the holder job scripts"

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], check=True)
    # Dependencies come from the dev venv's site-packages on PYTHONPATH; its editable
    # finder for bftrainer is a .pth file, which PYTHONPATH does not process.
    deps = {"PYTHONPATH": sysconfig.get_paths()["purelib"], "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [
            py,
            "-c",
            "import bftrainer.milp, bftrainer.idle_monitor, bftrainer.trainers;"
            "print(bftrainer.milp.__file__)",
        ],
        cwd=tmp_path,
        env=deps,
        check=True,
        capture_output=True,
        text=True,
    )
    assert out.stdout.startswith(str(env_dir))
    run = subprocess.run(
        [env_dir / "bin" / "bftrainer", "allocate", str(ROOT / "examples" / "problem.json")],
        cwd=tmp_path,
        env=deps,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "status optimal" in run.stdout

    # The daemon submits the installed copy of its holder script, not the source tree's.
    where = subprocess.run(
        [
            py,
            "-c",
            "from bftrainer.holders import lsf, slurm; print(slurm.SCRIPT); print(lsf.SCRIPT)",
        ],
        cwd=tmp_path,
        env=deps,
        check=True,
        capture_output=True,
        text=True,
    )
    scripts = [Path(line) for line in where.stdout.splitlines()]
    site = Path(out.stdout).parents[2]  # site-packages
    assert scripts == [site / name for name in HOLDER_SCRIPTS]
    assert all(
        s.read_bytes() == (ROOT / s.relative_to(site / "bftrainer")).read_bytes() for s in scripts
    )
    # Without it, the daemon stops at start in one line naming it (it would otherwise fail
    # every holder, poll after poll).
    scripts[0].unlink()
    daemon = subprocess.run(
        [
            env_dir / "bin" / "bftrainer",
            "daemon",
            "--scheduler",
            "slurm",
            "--bf-partition",
            "bf",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        cwd=tmp_path,
        env=deps,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert daemon.returncode == 2
    assert daemon.stderr.strip().splitlines() == [
        f"Error: this installation has no holder job script ({scripts[0]}); give the login "
        "node's copy with --holder-script"
    ]


def pinned() -> dict[str, str]:
    """constraints.txt as {normalised name: version}."""
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_constraints_pin_every_dependency_within_pyproject_ranges() -> None:
    """`make venv` installs with constraints.txt: each requirement of the package and of
    the extras it installs is pinned there, to a version pyproject.toml allows."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    installed = ["dev", "parquet", "slurm", "torch", "gurobi", "hpo"]
    assert f"EXTRAS := {','.join(installed)}" in (ROOT / "Makefile").read_text()
    pins = pinned()
    for text in [*project["dependencies"], *(r for e in installed for r in extras[e])]:
        req = Requirement(text)
        version = pins.get(canonicalize_name(req.name))
        assert version is not None, f"{req.name} is not pinned in constraints.txt"
        assert req.specifier.contains(version, prereleases=True), (req, version)


def warnings_in(output: str) -> list[str]:
    return [
        line.strip()
        for line in output.splitlines()
        if re.search(r"\w+Warning\b", line) and EDITABLE_NOTE not in line
    ]


@pytest.mark.slow
def test_pip_wheel_and_editable_install_print_no_warning(tmp_path: Path) -> None:
    """pip hides a build backend's warnings without -v; -v shows what a packager sees."""
    offline = ["--no-deps", "--no-build-isolation", "--no-index", "-v"]
    src = source_copy(tmp_path)
    wheel = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", *offline, "-w", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert wheel.returncode == 0, wheel.stderr
    assert not warnings_in(wheel.stdout + wheel.stderr)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    # setuptools (the backend, without build isolation) from the dev venv.
    env = {"PYTHONPATH": sysconfig.get_paths()["purelib"], "PATH": "/usr/bin:/bin"}
    editable = subprocess.run(
        [env_dir / "bin" / "python", "-m", "pip", "install", *offline, "-e", str(src)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert editable.returncode == 0, editable.stderr
    assert not warnings_in(editable.stdout + editable.stderr)
