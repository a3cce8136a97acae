"""The folders install as one namespace: nothing generic lands top-level in site-packages."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "bftrainer": "bftrainer",
    "milp": "bftrainer.milp",
    "idle_monitor": "bftrainer.idle_monitor",
    "trainers": "bftrainer.trainers",
}


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = set()
    for folder, name in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    assert found == listed


@pytest.mark.slow
def test_wheel_installs_under_one_namespace_in_a_fresh_venv(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("bftrainer-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"bftrainer", wheel.name.split("-py3")[0] + ".dist-info"}

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
    installed = ["dev", "parquet", "torch", "gurobi"]
    assert f"EXTRAS := {','.join(installed)}" in (ROOT / "Makefile").read_text()
    pins = pinned()
    for text in [*project["dependencies"], *(r for e in installed for r in extras[e])]:
        req = Requirement(text)
        version = pins.get(canonicalize_name(req.name))
        assert version is not None, f"{req.name} is not pinned in constraints.txt"
        assert req.specifier.contains(version, prereleases=True), (req, version)
