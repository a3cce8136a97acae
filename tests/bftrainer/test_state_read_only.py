"""Commands that only read the state (status, logs) never create, migrate or repair it,
and say in one line what is wrong with it (issue 19)."""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bftrainer.state import DB_NAME, DaemonLock, Store, ensure_state_dir, read_again
from bftrainer.state.errors import StateError
from tests.conftest import bftrainer, one_error

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"


def state_with_a_trainer(tmp_path: Path) -> tuple[Path, str]:
    path = ensure_state_dir(tmp_path / "state")
    with Store.open(path) as store:
        tid = store.submit(EXAMPLE, ["--work-samples", "10"])
    return path, tid


def empty_file(db: Path) -> None:
    db.unlink()
    db.write_bytes(b"")


def a_folder(db: Path) -> None:
    db.unlink()
    db.mkdir()


def sql(statement: str) -> Callable[[Path], None]:
    def change(db: Path) -> None:
        conn = sqlite3.connect(db)
        conn.execute(statement)
        conn.commit()
        conn.close()

    return change


def torn_page(db: Path) -> None:
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big") or 65536
    assert len(data) >= 3 * page
    data[2 * page : 3 * page] = bytes(range(256)) * (page // 256)
    db.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (empty_file, "empty (0 bytes)"),
        (a_folder, "not a regular file"),
        (sql("DROP TABLE allocations"), "damaged"),
        (sql("UPDATE trainers SET args = '{not json'"), "damaged"),
        (sql("INSERT INTO settings (key, value) VALUES ('pool', '[1, 2]')"), "damaged"),
        (sql("PRAGMA user_version = 0"), "schema version 0"),
        (torn_page, DB_NAME),
    ],
    ids=["empty", "folder", "no-table", "bad-json", "setting-shape", "no-version", "torn"],
)
def test_status_reports_a_damaged_store_and_leaves_it_as_it_was(
    tmp_path: Path, damage: Callable[[Path], None], message: str
) -> None:
    state, _ = state_with_a_trainer(tmp_path)
    db = state / DB_NAME
    for suffix in ("-wal", "-shm"):
        (state / (DB_NAME + suffix)).unlink(missing_ok=True)
    damage(db)
    before = sorted(p.name for p in state.iterdir())
    digest = hashlib.sha256(db.read_bytes()).hexdigest() if db.is_file() else None
    for args in (["status"], ["status", "--json"]):
        line = one_error(bftrainer(*args, "--state-dir", str(state)))
        assert message in line and str(state) in line
    assert sorted(p.name for p in state.iterdir()) == before, "nothing created"
    if digest is not None:
        assert hashlib.sha256(db.read_bytes()).hexdigest() == digest, "nothing written"


def test_logs_of_a_trainer_whose_directory_is_gone_is_an_error(tmp_path: Path) -> None:
    state, tid = state_with_a_trainer(tmp_path)
    gone = tmp_path / "gone"
    with Store.open(state) as store:
        store.set_launch(tid, trainer_dir=str(gone), supervisor="1")
    line = one_error(bftrainer("logs", tid, "--state-dir", str(state)))
    assert str(gone) in line and "gone" in line


def test_a_state_directory_that_cannot_be_written_is_named_not_the_database(
    tmp_path: Path,
) -> None:
    """An immutable folder (chattr +i) stands for a read-only one: root ignores modes."""
    state, tid = state_with_a_trainer(tmp_path)
    for suffix in ("-wal", "-shm"):
        (state / (DB_NAME + suffix)).unlink(missing_ok=True)
    with DaemonLock(state):  # cancel needs a daemon; its lock file is made first
        if subprocess.run(["chattr", "+i", str(state)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available here")
        try:
            line = one_error(bftrainer("cancel", tid, "--state-dir", str(state)))
            assert f"state directory {state} is not writable" in line, line
            # Reading needs no write: status answers (issue 31).
            done = bftrainer("status", "--state-dir", str(state))
            assert done.returncode == 0 and tid in done.stdout, done.stderr
        finally:
            subprocess.run(["chattr", "-i", str(state)], check=True)


def every_file(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def killed_writer(state: Path) -> None:
    """A writer killed after its commit (kill -9): a -wal and -shm with a commit in them."""
    code = (
        "import os, sys; from pathlib import Path; from bftrainer.state import Store; "
        "s = Store.open(Path(sys.argv[1])); s.set_setting('probe', 1); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", code, str(state)], check=True)
    assert (state / (DB_NAME + "-wal")).stat().st_size > 0


READ_ONLY_COMMANDS = [
    ["status"],
    ["status", "--json"],
    ["status", "{tid}"],
    ["logs", "{tid}"],
    ["cancel", "t9999"],
    ["report", "--out", "{out}"],
]


@pytest.mark.parametrize("writer", ["stopped", "killed", "open"])
def test_read_only_commands_change_no_byte_of_the_state_directory(
    tmp_path: Path, writer: str
) -> None:
    """Every file of the state directory, names and bytes, is the same after each
    read-only command: with the daemon stopped cleanly, killed, or running (a writer
    holds the store open and the daemon's lock)."""
    state, tid = state_with_a_trainer(tmp_path)
    with Store.open(state) as store:
        store.add_pool_event(joined=["n1", "n2"], now_s=1_700_000_000.0)
        store.add_pool_event(left=["n2"], now_s=1_700_000_005.0)
    if writer == "killed":
        killed_writer(state)
    with contextlib.ExitStack() as stack:
        if writer == "open":
            stack.enter_context(DaemonLock(state))
            store = stack.enter_context(Store.open(state))
            store.set_setting("probe", 2)
        before = every_file(state)
        for command in READ_ONLY_COMMANDS:
            out = tmp_path / "report"
            args = [a.format(tid=tid, out=out) for a in command]
            done = bftrainer(*args, "--state-dir", str(state))
            assert "Traceback" not in done.stderr, done.stderr
            if command[0] in ("status", "report"):
                assert done.returncode == 0, done.stderr
            assert every_file(state) == before, f"{command} changed the state directory"
        if writer == "open":
            assert store.get_setting("probe") == 2


# A writer that opens, writes and closes the store over and over for 4 s (each close
# checkpoints and deletes the -wal and -shm), as daemons starting and stopping do.
KEEP_WRITING = (
    "import sys, time; from pathlib import Path; from bftrainer.state import Store\n"
    "until = time.monotonic() + 4\n"
    "while time.monotonic() < until:\n"
    "    with Store.open(Path(sys.argv[1])) as s:\n"
    "        s.set_setting('pool', {'time_s': time.time(), 'nodes': {}})\n"
)


def test_a_read_only_open_beside_a_writer_that_opens_and_closes_never_fails(
    tmp_path: Path,
) -> None:
    """A reader chooses how to read by the -wal and -shm it finds; a writer closing right
    then deletes them under it. Before the reader looked again, about 3 opens a second
    failed so here ("unable to open database file", "attempt to write a readonly
    database": `logs -f` died of it once in a fresh clone's suite), and a read after the
    open once failed so in CI. Each is a store that changed while read now, which
    ``read_again`` (status, logs, report) reads afresh: no read fails."""
    state, _ = state_with_a_trainer(tmp_path)

    def read_pool() -> object:
        with Store.open(state, read_only=True) as store:
            return store.get_setting("pool")

    writer = subprocess.Popen([sys.executable, "-c", KEEP_WRITING, str(state)])
    opens, failures = 0, []
    try:
        while writer.poll() is None:
            opens += 1
            try:
                read_again(read_pool)
            except StateError as exc:
                failures.append(str(exc))
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait(timeout=30)
    assert writer.returncode == 0
    assert opens > 100, opens
    assert not failures, f"{len(failures)} of {opens} opens failed: {failures[:3]}"
