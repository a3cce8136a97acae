"""A store whose rows hold what bftrainer never writes there (damaged by hand or by a
tool): every command that reads it says so in one line naming the store, the row and the
field, exits non-zero, and the read-only ones change nothing in the state directory."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from bftrainer.state import DB_NAME, DamagedRecordError, Store, ensure_state_dir
from tests.conftest import bftrainer, one_error

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_mlp.py"
T0 = 1_700_000_000.0


def build_store(state: Path) -> Path:
    """One running trainer on a held node, with a metrics record and the pool setting;
    every row written through the store's own API. Returns state.db, alone (no -wal)."""
    with Store.open(ensure_state_dir(state)) as s:
        s.add_pool_event(joined=["n1"], now_s=T0)
        s.add_holder("11", "n1", now_s=T0)
        tid = s.submit(EXAMPLE, (), backend="torchrun", n_max=2, work_samples=1000, now_s=T0)
        s.set_trainer_state(tid, "running", now_s=T0 + 1)
        s.record_allocation(tid, ["n1"], now_s=T0 + 1)
        s.update_progress(tid, samples_done=10, throughput_sps=3.0)
        s.add_metric(tid, {"nodes": 1}, now_s=T0 + 2)
        s.set_setting("pool", {"time_s": T0, "nodes": {}})
    return state / DB_NAME


def damage(db: Path, sql: str) -> None:
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA ignore_check_constraints = ON")
    conn.execute(sql)
    conn.commit()
    conn.close()


def snapshot(state: Path) -> dict[str, tuple[int, bytes]]:
    """Every path under the state directory: its mode and, for a file, its bytes."""
    out = {}
    for p in sorted(state.rglob("*")):
        st = p.lstat()
        data = p.read_bytes() if stat.S_ISREG(st.st_mode) else b""
        out[str(p.relative_to(state))] = (st.st_mode, data)
    return out


STATUS = (("status",), ("status", "--json"))
REPORT = (("report",),)
ALL = STATUS + REPORT
T1 = "trainers row t0001"

# (id, the damage, the read-only commands that read that row, what the line names)
DAMAGES = [
    ("rate-text", "UPDATE trainers SET throughput_sps = 'NaN'", ALL, [T1, "throughput_sps"]),
    ("rate-negative", "UPDATE trainers SET throughput_sps = -5", ALL, [T1, "throughput_sps"]),
    ("samples-text", "UPDATE trainers SET samples_done = 'lots'", ALL, [T1, "samples_done"]),
    ("samples-huge", "UPDATE trainers SET samples_done = 1e308", ALL, [T1, "samples_done"]),
    ("submit-text", "UPDATE trainers SET submit_s = 'yesterday'", ALL, [T1, "submit_s"]),
    ("args-json", "UPDATE trainers SET args = '{bad'", ALL, [T1, "args"]),
    ("script-not-utf8", "UPDATE trainers SET script = CAST(x'ff' AS TEXT)", ALL, [T1, "script"]),
    ("nodes-number", "UPDATE allocations SET nodes = '5'", ALL, ["allocations row 1", "nodes"]),
    ("metrics-json", "UPDATE metrics SET record = '{bad'", ALL, ["metrics row 1", "record"]),
    (
        "setting-json",
        "UPDATE settings SET value = '{bad' WHERE key = 'pool'",
        STATUS,
        ["settings row 'pool'", "value"],
    ),
    ("rungs-dropped", "ALTER TABLE trainers DROP COLUMN rungs", ALL, ["'trainers'", "'rungs'"]),
    # status shows the pool from the daemon's setting: only the report reads these rows.
    ("event-time-text", "UPDATE pool_events SET time_s = 'x'", REPORT, ["pool_events row 1"]),
    (
        "holder-time-text",
        "UPDATE holders SET submit_s = 'x'",
        REPORT,
        ["holders row 1", "submit_s"],
    ),
    (
        "holder-time-far",
        "UPDATE holders SET submit_s = 1e300",
        REPORT,
        ["holders row of job 11", "submit_s"],
    ),
]


@pytest.mark.parametrize(
    ("sql", "commands", "named"),
    [d[1:] for d in DAMAGES],
    ids=[d[0] for d in DAMAGES],
)
def test_a_read_only_command_names_a_damaged_row_in_one_line_and_changes_nothing(
    tmp_path: Path, sql: str, commands: Sequence[tuple[str, ...]], named: list[str]
) -> None:
    state = tmp_path / "state"
    db = build_store(state)
    damage(db, sql)
    before = snapshot(state)
    for command in commands:
        out = ("--out", str(tmp_path / "report")) if command[0] == "report" else ()
        line = one_error(bftrainer(*command, "--state-dir", str(state), *out))
        assert str(db) in line and all(n in line for n in named), (command, line)
        assert "damaged" in line, line
        assert snapshot(state) == before, command


def fifo(db: Path) -> None:
    db.unlink()
    os.mkfifo(db, 0o600)


def folder(db: Path) -> None:
    db.unlink()
    db.mkdir(mode=0o700)


def by_sql(sql: str) -> Callable[[Path], None]:
    return lambda db: damage(db, sql)


@pytest.mark.parametrize(
    ("spoil", "named"),
    [
        (
            by_sql("ALTER TABLE trainers DROP COLUMN rungs"),
            "table 'trainers' has no column 'rungs'",
        ),
        (by_sql("UPDATE trainers SET args = '{bad'"), f"{T1}: args"),
        (by_sql("UPDATE trainers SET samples_done = 'lots'"), f"{T1}: samples_done"),
        (by_sql("UPDATE holders SET limit_s = 'x'"), "holders row 1 (job 11): limit_s"),
        (fifo, "state.db is a FIFO, not a regular file"),
        (folder, "state.db is a folder, not a regular file"),
    ],
    ids=["column-dropped", "args-json", "samples-text", "holder-limit-text", "fifo", "folder"],
)
def test_the_daemon_names_a_damaged_store_at_start_in_one_line(
    tmp_path: Path, spoil: Callable[[Path], None], named: str
) -> None:
    """Refused before the daemon asks its scheduler anything (there is none here: a
    daemon that started would poll on and never end)."""
    state = tmp_path / "state"
    spoil(build_store(state))
    done = bftrainer(
        "daemon", "--scheduler", "slurm", "--bf-partition", "bf", "--state-dir", str(state)
    )
    line = one_error(done)
    assert named in line and str(state) in line, line


# ---------------------------------------------------------------------- the row checks


@pytest.mark.parametrize(
    ("sql", "read", "named"),
    [
        ("UPDATE trainers SET backend = 'mpi'", Store.trainers, "backend"),
        ("UPDATE trainers SET n_max = 0", Store.trainers, "n_max"),
        ("UPDATE trainers SET work_samples = 0", Store.trainers, "work_samples"),
        ("UPDATE trainers SET rescale_up_s = -1", Store.trainers, "rescale_up_s"),
        ("UPDATE trainers SET finished_s = 1e999", Store.trainers, "finished_s"),
        ("UPDATE trainers SET cancel_requested = 2", Store.trainers, "cancel_requested"),
        ("UPDATE trainers SET batch_size = -1", Store.trainers, "batch_size"),
        ("UPDATE trainers SET restarts = 'x'", Store.trainers, "restarts"),
        ("UPDATE trainers SET rungs = -1", Store.trainers, "rungs"),
        ("UPDATE trainers SET trainer_dir = x'2f'", Store.trainers, "trainer_dir"),
        ("UPDATE trainers SET args = '[1]'", Store.trainers, "args"),
        ("UPDATE allocations SET slots = '{\"n1\": [-1]}'", Store.current_allocations, "slots"),
        ("UPDATE holders SET limit_s = 0", lambda s: s.holders(), "limit_s"),
        ("UPDATE holders SET state = 'gone'", lambda s: s.holder("11"), "state"),
        ('UPDATE pool_events SET windows = \'{"n1": "soon"}\'', Store.pool_events, "windows"),
        ("UPDATE pool_events SET joined = '\"n1\"'", Store.pool_events, "joined"),
        ("UPDATE metrics SET record = '[1]'", lambda s: s.metrics("t0001"), "record"),
        ("UPDATE metrics SET time_s = x'00'", lambda s: s.metrics("t0001"), "time_s"),
    ],
)
def test_each_field_is_checked_where_its_row_is_read(
    tmp_path: Path, sql: str, read: Callable[[Store], object], named: str
) -> None:
    state = tmp_path / "state"
    damage(build_store(state), sql)
    with Store.open(state, read_only=True) as store, pytest.raises(DamagedRecordError) as err:
        read(store)
    table = sql.split()[1]
    assert err.value.table == table and err.value.field == named
    assert f"{table} row " in str(err.value) and f": {named} is " in str(err.value)


def test_a_store_written_by_the_api_passes_every_check(tmp_path: Path) -> None:
    state = tmp_path / "state"
    build_store(state)
    with Store.open(state) as store:
        store.check_records()
        (row,) = store.trainers()
        assert (row.samples_done, row.throughput_sps, row.work_samples) == (10, 3.0, 1000)
        assert store.current_allocation("t0001") == ("n1",)
