"""The docs name modules that exist: every path of the project's code that docs/*.md
name (``bftrainer/loop/core.py``, ``milp/solvers/``, ...) is there, and every
``bftrainer.X`` names a module or package of the project. A module moved or renamed
(issue 43 gave the loose modules rooms) leaves no doc pointing at where it was, except
in the first column of a table of renames (a table whose header starts ``| old |``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
# A source folder, as docs write it, then the rest of the path (a file, or a folder).
PATH = re.compile(r"(?<![\w/.-])((?:bftrainer|milp|trainers|idle_monitor)/[\w/]*\w(?:\.py|/))")
DOTTED = re.compile(r"(?<![\w.])bftrainer\.(\w+)")
# bftrainer.X installed from a top-level folder (pyproject.toml's package-dir).
TOP = {"milp": "milp", "idle_monitor": "idle_monitor", "trainers": "trainers"}
# Paths as installed, where the source tree has them elsewhere.
INSTALLED = {"bftrainer/scripts/": "scripts/"}
# File names that start like a module: the metrics' textfile, a config file.
FILE_NAMES = {"prom", "toml"}


def named_paths(text: str) -> set[str]:
    return set(PATH.findall(text))


def source_path(path: str) -> Path:
    for installed, source in INSTALLED.items():
        if path.startswith(installed):
            return ROOT / source / path.removeprefix(installed)
    return ROOT / path


def current_text(text: str) -> str:
    """``text`` without the old names of a table of renames (its first column)."""
    lines, renames = [], False
    for line in text.splitlines():
        renames = line.startswith("| old |") or (renames and line.startswith("|"))
        lines.append("|" + line.split("|", 2)[2] if renames and line.count("|") > 2 else line)
    return "\n".join(lines)


def missing_paths(doc: Path) -> list[str]:
    named = named_paths(current_text(doc.read_text()))
    return sorted(p for p in named if not source_path(p).exists())


def is_module(name: str) -> bool:
    """``bftrainer.name`` is a module or a package of the project (or ``__version__``)."""
    if name == "__version__" or name in FILE_NAMES:
        return True
    if name in TOP:
        return (ROOT / TOP[name]).is_dir()
    return (ROOT / "bftrainer" / f"{name}.py").is_file() or (ROOT / "bftrainer" / name).is_dir()


def test_every_code_path_in_the_docs_exists() -> None:
    missing = [f"{doc.name}: {p}" for doc in DOCS for p in missing_paths(doc)]
    assert not missing, "docs name paths that are not there:\n" + "\n".join(missing)


def test_every_bftrainer_module_in_the_docs_exists() -> None:
    missing = sorted(
        {
            f"{doc.name}: bftrainer.{name}"
            for doc in DOCS
            for name in DOTTED.findall(current_text(doc.read_text()))
            if not is_module(name)
        }
    )
    assert not missing, "docs name modules that are not there:\n" + "\n".join(missing)


def test_the_check_reads_paths_as_docs_write_them() -> None:
    """A moved module is caught; a test path or a path inside another is not read as
    a module path."""
    text = (
        "`bftrainer/loop/core.py` and bftrainer/live.py, (`milp/solvers/`),"
        " tests/bftrainer/test_loop.py, .venv/bin/bftrainer/x.py"
    )
    assert named_paths(text) == {"bftrainer/loop/core.py", "bftrainer/live.py", "milp/solvers/"}
    assert not (ROOT / "bftrainer/live.py").exists()
    assert DOTTED.findall("`bftrainer.loop.run`, tests.bftrainer.x") == ["loop"]
    assert is_module("loop") and is_module("milp") and not is_module("live")
    renames = "| old | new |\n| --- | --- |\n| `bftrainer/live.py` | `bftrainer/daemon/x.py` |\n"
    assert named_paths(current_text(renames)) == {"bftrainer/daemon/x.py"}
    assert named_paths(current_text(renames + "\nbftrainer/live.py")) == {
        "bftrainer/daemon/x.py",
        "bftrainer/live.py",
    }


DOC_FILE = re.compile(r"(?<![\w/.-])docs/([\w.-]+\.md)")
CODE = ("bftrainer", "milp", "trainers", "idle_monitor", "tests", "benchmarks", "examples")


def test_every_doc_the_code_names_exists() -> None:
    """The other way: a docstring or comment that sends its reader to a doc finds it
    (two pointed at a centre.md that docs/ never had)."""
    missing = {
        f"{py.relative_to(ROOT)}: docs/{name}"
        for folder in CODE
        for py in (ROOT / folder).rglob("*.py")
        for name in DOC_FILE.findall(py.read_text())
        if not (ROOT / "docs" / name).is_file()
    }
    assert not missing, sorted(missing)
