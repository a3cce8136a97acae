"""The recorder: every record lands in a canonical trace that replays; files rotate with
a snapshot each; a restart continues the newest file; SIGTERM stops it cleanly."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.idle_monitor.lsf import LsfScheduler
from bftrainer.idle_monitor.recorder import Recorder, RecorderConfig, RecorderError
from bftrainer.idle_monitor.runner import ReplayRunner, recorded
from bftrainer.idle_monitor.slurm import SlurmScheduler
from bftrainer.idle_monitor.source import LivePoolSource, PoolConfig
from bftrainer.idle_monitor.trace import Trace, load_trace
from tests.conftest import wait_until

FIXTURES = Path(__file__).resolve().parents[2] / "idle_monitor" / "fixtures"
REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


def slurm_source(clock: Clock) -> tuple[LivePoolSource, ReplayRunner]:
    runner = ReplayRunner(
        {"sinfo": [recorded("n1|idle\n")], "squeue": [recorded("")], "scontrol": [recorded("")]}
    )
    return LivePoolSource(SlurmScheduler(), runner, PoolConfig(), clock=clock), runner


def sinfo(idle: set[str], n: int) -> str:
    return "".join(f"n{i}|{'idle' if f'n{i}' in idle else 'allocated'}\n" for i in range(n))


def states_sequence(n: int, steps: int) -> list[set[str]]:
    # a deterministic churn: node i idle at step k when (i * 7 + k * 3) % 5 < 2
    return [{f"n{i}" for i in range(n) if (i * 7 + k * 3) % 5 < 2} for k in range(steps)]


def test_records_replay_as_the_same_states(tmp_path: Path) -> None:
    clock = Clock()
    source, runner = slurm_source(clock)
    recorder = Recorder(source, tmp_path, RecorderConfig(interval_s=10))
    seq = states_sequence(6, 8)
    for k, idle in enumerate(seq):
        clock.t = 1_700_000_000.0 + 10 * k
        runner.set_replies("sinfo", [recorded(sinfo(idle, 6))])
        recorder.record_once()
        # flushed per record: a reader sees it while the recorder is running
        trace = load_trace(recorder.path)  # type: ignore[arg-type]
        assert trace.end_s == clock.t or k == 0
    recorder.close()
    (path,) = tmp_path.glob("pool-*.csv")
    trace = load_trace(path)
    assert trace.nodes and set(trace.nodes) == {f"n{i}" for i in range(6)}
    state = set(trace.initial_idle)
    assert state == seq[0]
    replayed = {trace.start_s: set(state)}
    for event in trace.events:
        state = (state | event.joined) - event.left
        replayed[event.time_s] = set(state)
    for k, idle in enumerate(seq):
        t = 1_700_000_000.0 + 10 * k
        last = max(s for s in replayed if s <= t)
        assert replayed[last] == idle, f"record {k}"


def test_restart_continues_without_second_snapshot(tmp_path: Path) -> None:
    clock = Clock()
    seq = states_sequence(5, 6)
    for part in (seq[:3], seq[3:]):
        source, runner = slurm_source(clock)
        recorder = Recorder(source, tmp_path)
        for idle in part:
            clock.t += 10
            runner.set_replies("sinfo", [recorded(sinfo(idle, 5))])
            recorder.record_once()
        recorder.close()
    files = list(tmp_path.glob("pool-*.csv"))
    assert len(files) == 1
    lines = files[0].read_text().splitlines()
    assert sum(1 for line in lines if line.startswith("time,")) == 1
    trace = load_trace(files[0], strict=True)
    first_time = lines[1].split(",")[0]
    assert sum(1 for line in lines[1:] if line.startswith(first_time + ",")) == 5
    state = set(trace.initial_idle)
    for event in trace.events:
        state = (state | event.joined) - event.left
    assert state == seq[-1]


def test_rotation_by_size_each_file_replays_alone(tmp_path: Path) -> None:
    clock = Clock()
    source, runner = slurm_source(clock)
    recorder = Recorder(source, tmp_path, RecorderConfig(max_bytes=2048))
    seq = states_sequence(40, 12)
    for idle in seq:
        clock.t += 10
        runner.set_replies("sinfo", [recorded(sinfo(idle, 40))])
        recorder.record_once()
    recorder.close()
    files = recorder.files()
    assert len(files) >= 2
    previous_end: set[str] | None = None
    for path in files:
        trace = load_trace(path, strict=True)  # strict: every node in the file's snapshot
        assert len(trace.nodes) == 40
        if previous_end is not None:
            assert set(trace.initial_idle) == previous_end
        state = set(trace.initial_idle)
        for event in trace.events:
            state = (state | event.joined) - event.left
        previous_end = state
    assert previous_end == seq[-1]


def test_failed_reading_records_an_outage_and_clock_going_back_starts_a_new_file(
    tmp_path: Path,
) -> None:
    clock = Clock()
    source, runner = slurm_source(clock)
    recorder = Recorder(source, tmp_path)
    runner.set_replies("sinfo", [recorded(sinfo({"n0"}, 3))])
    assert recorder.record_once() == 3
    runner.set_replies(
        "sinfo", [recorded(stderr="Unable to contact slurm controller", returncode=1)]
    )
    clock.t += 10
    assert recorder.record_once() == 1  # n0, idle, is busy while nobody can see it
    assert recorder.record_once() == 0  # still out: nothing new
    runner.set_replies("sinfo", [recorded(sinfo({"n1"}, 3))])
    clock.t -= 3600  # the clock was stepped back
    recorder.record_once()
    recorder.close()
    files = recorder.files()
    assert len(files) == 2
    assert load_trace(files[-1]).initial_idle == {"n1"}


def test_output_folder_that_is_a_file(tmp_path: Path) -> None:
    clock = Clock()
    source, _ = slurm_source(clock)
    blocker = tmp_path / "logs"
    blocker.write_text("")
    with pytest.raises(RecorderError, match="logs"):
        Recorder(source, blocker).open()


def test_run_stops_on_event(tmp_path: Path) -> None:
    clock = Clock()
    source, _ = slurm_source(clock)
    recorder = Recorder(source, tmp_path, RecorderConfig(interval_s=0.05))
    stop = threading.Event()
    thread = threading.Thread(target=recorder.run, args=(stop,))
    thread.start()
    wait_until(lambda: recorder.records >= 3, 10, "three records")
    stop.set()
    thread.join(10)
    assert not thread.is_alive() and recorder.path is None  # closed


# ---------------------------------------------------------------------- the command


def fake_lsf_bin(tmp_path: Path) -> Path:
    """``bhosts``/``bslots`` programs that print the recorded LSF outputs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program, name in [("bhosts", "lsf-bhosts-wide.txt"), ("bslots", "lsf-bslots-long.txt")]:
        script = bin_dir / program
        script.write_text(f"#!/bin/sh\nexec cat {FIXTURES / name}\n")
        script.chmod(0o755)
    return bin_dir


def test_record_command_stops_on_sigterm_and_restarts(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{fake_lsf_bin(tmp_path)}:{os.environ['PATH']}"}
    out = tmp_path / "logs"
    argv = [sys.executable, "-m", "bftrainer", "trace", "record", "--scheduler", "lsf"]
    argv += ["--interval", "0.2"]
    proc = subprocess.Popen(
        [*argv, "--out", str(out)], env=env, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        wait_until(lambda: any(out.glob("pool-*.csv")), 20, "a trace file")
        (path,) = out.glob("pool-*.csv")
        wait_until(lambda: path.stat().st_size > 200, 20, "the snapshot")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopped:" in err
    trace = load_trace(path, strict=True)
    assert "a01n02" in trace.initial_idle and "a01n01" not in trace.initial_idle
    done = subprocess.run(
        [*argv, "--out", str(out), "--polls", "2"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert list(out.glob("pool-*.csv")) == [path]  # continued, nothing changed: no new rows
    assert load_trace(path, strict=True).initial_idle == trace.initial_idle


def test_lsf_recorder_windows_in_file(tmp_path: Path) -> None:
    runner = ReplayRunner(
        {
            "bhosts": [recorded((FIXTURES / "lsf-bhosts-wide.txt").read_text())],
            "bslots": [recorded((FIXTURES / "lsf-bslots-long.txt").read_text())],
        }
    )
    clock = Clock()
    source = LivePoolSource(LsfScheduler(), runner, clock=clock)
    recorder = Recorder(source, tmp_path)
    recorder.record_once()
    recorder.close()
    (path,) = tmp_path.glob("pool-*.csv")
    trace = load_trace(path)
    assert trace.initial_windows_s["a01n08"] == 7800.0
    assert trace.initial_windows_s["a01n02"] is None


# ---------------------------------------------------------------------- issue 10


class SlowClaims(ReplayRunner):
    """squeue retries for a minute (the controller restarts) before sinfo is read."""

    def __init__(self, replies: dict, clock: Clock, delay_s: float) -> None:
        super().__init__(replies)
        self.clock, self.delay_s = clock, delay_s

    def run(self, argv, **kwargs):  # type: ignore[no-untyped-def, override]
        if argv[0] == "squeue":
            self.clock.t += self.delay_s
        return super().run(argv, **kwargs)


def pool_at(trace: Trace, time_s: float) -> set[str]:
    state = set(trace.initial_idle)
    for event in trace.events:
        if event.time_s > time_s:
            break
        state = (state | event.joined) - event.left
    return state


def test_a_record_is_stamped_when_its_node_states_were_read(tmp_path: Path) -> None:
    clock = Clock()
    runner = SlowClaims(
        {
            "sinfo": [recorded(sinfo({"n0"}, 2))],
            "squeue": [recorded("")],
            "scontrol": [recorded("")],
        },
        clock,
        delay_s=60.0,
    )
    source = LivePoolSource(SlurmScheduler(), runner, PoolConfig(), clock=clock)
    recorder = Recorder(source, tmp_path)
    began = clock.t
    recorder.record_once()
    recorder.close()
    trace = load_trace(recorder.files()[-1])
    assert trace.start_s == began + 60.0  # not back-dated to the poll's start
    assert source.last_reading is not None and source.last_reading.time_s == began + 60.0


def test_an_outage_is_recorded_so_a_replay_counts_no_unseen_node(tmp_path: Path) -> None:
    clock = Clock()
    source, runner = slurm_source(clock)
    recorder = Recorder(source, tmp_path)
    t0 = clock.t
    runner.set_replies("sinfo", [recorded(sinfo({"n0", "n1"}, 3))])
    recorder.record_once()
    down = recorded(
        stderr="slurm_load_partitions: Unable to contact slurm controller", returncode=1
    )
    for k in (1, 2, 3):
        clock.t = t0 + 10 * k
        runner.set_replies("sinfo", [down])
        recorder.record_once()
    clock.t = t0 + 40
    runner.set_replies("sinfo", [recorded(sinfo({"n1", "n2"}, 3))])
    recorder.record_once()
    recorder.close()
    trace = load_trace(recorder.files()[-1], strict=True)
    assert pool_at(trace, t0 + 5) == {"n0", "n1"}
    assert pool_at(trace, t0 + 10) == set()  # from the first poll that could not see
    assert pool_at(trace, t0 + 39) == set()
    assert pool_at(trace, t0 + 40) == {"n1", "n2"}


@pytest.mark.parametrize("stop", ["polls", "event"])
def test_an_orderly_stop_closes_the_trace_at_the_last_poll(tmp_path: Path, stop: str) -> None:
    clock = Clock()
    source, runner = slurm_source(clock)
    runner.set_replies("sinfo", [recorded(sinfo({"n0"}, 2))])
    recorder = Recorder(source, tmp_path, RecorderConfig(interval_s=0.01))
    t0 = clock.t

    class Ticking(threading.Event):
        """Each wait between polls is 10 s of the fake clock; stops after 5 polls."""

        def wait(self, timeout: float | None = None) -> bool:
            clock.t += 10
            if stop == "event" and clock.t > t0 + 40:
                self.set()
            return self.is_set()

    recorder.run(Ticking(), polls=5 if stop == "polls" else None)
    trace = load_trace(recorder.files()[-1], strict=True)
    assert trace.start_s == t0
    assert not trace.events  # the state never changed...
    assert trace.end_s == t0 + 40  # ...and the quiet stretch up to the last poll is kept


def test_a_restart_marks_the_gap_while_nobody_recorded(tmp_path: Path) -> None:
    clock = Clock()
    source, runner = slurm_source(clock)
    runner.set_replies("sinfo", [recorded(sinfo({"n0", "n1"}, 2))])
    first = Recorder(source, tmp_path)
    t0 = clock.t
    first.record_once()
    # kill -9: no close, no end row
    first._writer._file.close()  # type: ignore[union-attr]
    clock.t = t0 + 3600
    source2, runner2 = slurm_source(clock)
    runner2.set_replies("sinfo", [recorded(sinfo({"n0", "n1"}, 2))])
    second = Recorder(source2, tmp_path)
    second.record_once()
    second.close()
    (path,) = tmp_path.glob("pool-*.csv")
    trace = load_trace(path, strict=True)
    assert pool_at(trace, t0) == {"n0", "n1"}
    assert pool_at(trace, t0 + 1) == set()  # the gap: nobody was looking
    assert pool_at(trace, t0 + 3599) == set()
    assert pool_at(trace, t0 + 3600) == {"n0", "n1"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\n", "not UTF-8 text"),
        (b"time,node,idle\n2021-02-10 00:00:00,a,yes\n", "unknown idle value"),
        (b"name,age\nalice,3\n", "missing required column"),
        (b"time,node,idle\n1612915732000,a,1\n", "milliseconds"),
    ],
)
def test_a_damaged_or_foreign_newest_file_gets_one_clear_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    out = tmp_path / "logs"
    out.mkdir()
    bad = out / "pool-20990101T000000Z.csv"
    bad.write_bytes(content)
    source, _ = slurm_source(Clock())
    with pytest.raises(RecorderError, match=r"pool-20990101T000000Z\.csv") as info:
        Recorder(source, out).open()
    assert message in str(info.value) and "\n" not in str(info.value)
    assert bad.read_bytes() == content  # left untouched
    result = CliRunner().invoke(
        cli, ["trace", "record", "--scheduler", "slurm", "--polls", "1", "--out", str(out)]
    )
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output


def test_a_newest_file_that_is_a_folder_gets_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "pool-x.csv").mkdir()
    source, _ = slurm_source(Clock())
    with pytest.raises(RecorderError, match=r"pool-x\.csv"):
        Recorder(source, tmp_path).open()


@pytest.mark.parametrize("interval_s", [0.0, math.nan, 1e12])
def test_an_interval_no_wait_can_hold_is_refused(interval_s: float) -> None:
    """`trace record --interval 1e12` died in its first wait (OverflowError)."""
    with pytest.raises(ValueError, match="interval_s must be > 0 and <= 86400"):
        RecorderConfig(interval_s=interval_s)
