"""The daemon's Prometheus metrics (bftrainer/service/metrics.py, docs/deployment.md).

What an operator relies on: the textfile and the HTTP endpoint parse with Prometheus's
own parser and say what ``bftrainer status --json`` and ``squeue`` say, on a real daemon
with a real trainer on the local Slurm; a mistake in the settings is one line at start.
"""

from __future__ import annotations

import logging
import math
import socket
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bftrainer.daemon import load_daemon_config
from bftrainer.policies.config import ConfigError
from bftrainer.service.metrics import COMMAND_ERROR_KINDS, DaemonMetrics, MetricsError
from bftrainer.service.reading import HeldReading, HoldCounts, Reading
from bftrainer.state import TRAINER_STATES
from tests.bftrainer.daemon_service import BFTRAINER, Service, service_in
from tests.conftest import SlurmCluster, wait_until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition, by (name, sorted labels), through Prometheus's
    parser (so a malformed file or page fails here)."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return parse(reply.read().decode())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reading(**over: object) -> Reading:
    shared: dict[str, object] = {
        "pool_nodes": 8,
        "allocated_nodes": 4,
        "command_errors": {"holder_status": 1, "nodes": 2},
        "pool_read_s": 1000.0,
    }
    held: dict[str, object] = {
        "held_nodes": 5,
        "trainers": {**dict.fromkeys(TRAINER_STATES, 0), "running": 1, "done": 2},
        "holders": HoldCounts(acquired=9, preempted=2, released=1, lost=1),
        "rescales": 3,
    }
    for key, value in over.items():
        (shared if key in shared else held)[key] = value
    return Reading(**shared, held=HeldReading(**held))  # type: ignore[arg-type]


# ---------------------------------------------------------------------- the module


def test_the_textfile_and_the_endpoint_say_the_same_as_the_reading(tmp_path: Path) -> None:
    path = tmp_path / "bftrainer.prom"
    port = free_port()
    metrics = DaemonMetrics.open(path, port, clock=lambda: 1012.5)  # pool read at 1000
    try:
        metrics.update(reading(), 0.02)
        metrics.update(reading(), 3.0)
        metrics.update(reading(), None)  # a wake-up without a decision
        for samples in (parse(path.read_text()), scrape(port)):
            assert value(samples, "bftrainer_pool_nodes") == 8
            assert value(samples, "bftrainer_held_nodes") == 5
            assert value(samples, "bftrainer_allocated_nodes") == 4
            trainers = {s: value(samples, "bftrainer_trainers", state=s) for s in TRAINER_STATES}
            assert trainers == {**dict.fromkeys(TRAINER_STATES, 0), "running": 1, "done": 2}
            assert value(samples, "bftrainer_holders_acquired_total") == 9
            assert value(samples, "bftrainer_holders_preempted_total") == 2
            assert value(samples, "bftrainer_holders_released_total") == 1
            assert value(samples, "bftrainer_holders_lost_total") == 1
            assert value(samples, "bftrainer_rescales_total") == 3
            errors = {
                k: value(samples, "bftrainer_scheduler_command_errors_total", operation=k)
                for k in COMMAND_ERROR_KINDS
            }
            assert errors == {
                **dict.fromkeys(COMMAND_ERROR_KINDS, 0),
                "holder_status": 1,
                "nodes": 2,
            }
            assert value(samples, "bftrainer_pool_reading_age_seconds") == 12.5
            assert value(samples, "bftrainer_decision_latency_seconds_count") == 2
            assert value(samples, "bftrainer_decision_latency_seconds_sum") == pytest.approx(3.02)
            le = "bftrainer_decision_latency_seconds_bucket"
            assert value(samples, le, le="0.025") == 1
            assert value(samples, le, le="2.5") == 1
            assert value(samples, le, le="5.0") == 2
            assert value(samples, le, le="+Inf") == 2
            # Only ours: node_exporter exports process_* and go_* itself.
            assert all(name.startswith("bftrainer_") for name, _ in samples)
            assert not any(name.endswith("_created") for name, _ in samples)
        assert [p.name for p in tmp_path.iterdir()] == ["bftrainer.prom"]  # no temp file left
    finally:
        metrics.close()


def test_a_pool_never_read_has_an_infinite_age(tmp_path: Path) -> None:
    metrics = DaemonMetrics.open(tmp_path / "b.prom", None)
    metrics.update(reading(pool_read_s=None), None)
    age = value(parse((tmp_path / "b.prom").read_text()), "bftrainer_pool_reading_age_seconds")
    assert math.isinf(age)


def test_a_textfile_that_cannot_be_written_later_is_logged_once_and_the_daemon_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bftrainer.service.metrics")
    folder = tmp_path / "textfile"
    folder.mkdir()
    metrics = DaemonMetrics.open(folder / "b.prom", None)
    folder.rename(tmp_path / "gone")
    for _ in range(3):
        metrics.update(reading(), None)
    assert sum("not written" in r.getMessage() for r in caplog.records) == 1
    folder.mkdir()
    metrics.update(reading(), None)
    assert (folder / "b.prom").exists()
    assert any("written again" in r.getMessage() for r in caplog.records)


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsError) as info:
            DaemonMetrics.open(None, port)
    assert (
        str(info.value) == f"metrics port {port}: cannot listen on 127.0.0.1:{port}: already in use"
    )


def test_a_textfile_folder_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "bftrainer.prom"
    with pytest.raises(MetricsError, match=r"the folder .*nowhere does not exist"):
        DaemonMetrics.open(path, None)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("metrics_port = 0", "metrics_port = 0: expected a port number, 1 to 65535"),
        ('metrics_port = "9100"', "metrics_port = '9100': expected a port number"),
        (
            'metrics_textfile = "/tmp/b.txt"',
            "metrics_textfile = '/tmp/b.txt': expected a file name ending in .prom",
        ),
    ],
)
def test_bad_metrics_settings_name_the_key(tmp_path: Path, toml: str, message: str) -> None:
    config = tmp_path / "daemon.toml"
    config.write_text(f"[daemon]\n{toml}\n")
    with pytest.raises(ConfigError, match=rf"{config}: \[daemon\] {message}"):
        load_daemon_config(config, {})


def test_metrics_settings_from_the_file_and_flags() -> None:
    config = load_daemon_config(None, {"metrics_port": 9464, "metrics_textfile": "/x/b.prom"})
    assert (config.metrics_port, config.metrics_textfile) == (9464, "/x/b.prom")
    assert load_daemon_config(None, {}).metrics_port is None  # off by default


# ---------------------------------------------------------------------- the command


def run_daemon(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    argv = [*BFTRAINER, "daemon", "--scheduler", "slurm", "--bf-partition", "bf"]
    return subprocess.run(
        [*argv, "--state-dir", str(tmp_path / "state"), *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_daemon_refuses_a_port_in_use_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_daemon(tmp_path, "--metrics-port", str(port))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"Error: metrics port {port}: cannot listen on 127.0.0.1:{port}: already in use"
    ]


def test_the_daemon_refuses_a_textfile_folder_that_does_not_exist_with_one_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "nowhere" / "bftrainer.prom"
    done = run_daemon(tmp_path, "--metrics-textfile", str(path))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: metrics textfile {path}: the folder")


def test_the_daemon_refuses_a_textfile_not_ending_in_prom(tmp_path: Path) -> None:
    done = run_daemon(tmp_path, "--metrics-textfile", str(tmp_path / "b.txt"))
    assert done.returncode == 2
    assert "--metrics-textfile: metrics_textfile = " in done.stderr
    assert "ending in .prom" in done.stderr


def test_without_metrics_the_daemon_does_not_import_prometheus_client() -> None:
    code = (
        "import sys, bftrainer.cli, bftrainer.cli.daemon, bftrainer.daemon;"
        "print('prometheus_client' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


# ---------------------------------------------------------------------- end to end


@pytest.fixture
def service(slurm: SlurmCluster, tmp_path: Path) -> Iterator[Service]:
    with service_in(slurm, tmp_path) as s:
        yield s


def running_holders(cluster: SlurmCluster) -> list[str]:
    out = cluster.run(["squeue", "-h", "-p", "bf", "-n", "bftrainer-hold", "-t", "R", "-o", "%N"])
    return out.split()


def disagreements(samples: Samples, status: dict[str, object], held: list[str]) -> list[str]:
    """What the metrics say that status --json or squeue do not (empty: they agree)."""
    trainers = status["trainers"]
    pool = status["pool"]
    assert isinstance(trainers, list) and isinstance(pool, list)
    states = Counter(t["state"] for t in trainers)
    want = {
        "bftrainer_pool_nodes": len(pool),
        "bftrainer_held_nodes": len(held),
        "bftrainer_allocated_nodes": sum(len(t["nodes"]) for t in trainers),
        **{f"bftrainer_trainers[{s}]": states.get(s, 0) for s in TRAINER_STATES},
    }
    got = {
        "bftrainer_pool_nodes": value(samples, "bftrainer_pool_nodes"),
        "bftrainer_held_nodes": value(samples, "bftrainer_held_nodes"),
        "bftrainer_allocated_nodes": value(samples, "bftrainer_allocated_nodes"),
        **{
            f"bftrainer_trainers[{s}]": value(samples, "bftrainer_trainers", state=s)
            for s in TRAINER_STATES
        },
    }
    return [f"{k}: metrics {got[k]:g}, status/squeue {want[k]}" for k in want if got[k] != want[k]]


def agree(service: Service, port: int, textfile: Path, what: str) -> tuple[Samples, Samples]:
    """Wait until the endpoint and the file both agree with status and squeue (the file
    is rewritten at the daemon's next wake-up); fail listing what differs."""
    last: list[str] = []

    def check() -> bool:
        nonlocal last
        status, held = service.status(), running_holders(service.cluster)
        last = [f"endpoint {d}" for d in disagreements(scrape(port), status, held)]
        last += [f"textfile {d}" for d in disagreements(parse(textfile.read_text()), status, held)]
        return not last

    try:
        wait_until(check, 30, f"the metrics to agree with status and squeue ({what})")
    except AssertionError:
        raise AssertionError(f"{what}: {last}") from None
    return scrape(port), parse(textfile.read_text())


@pytest.mark.slurm
@pytest.mark.slow
def test_a_real_daemon_s_metrics_agree_with_status_and_squeue(
    service: Service, tmp_path: Path
) -> None:
    textfile_dir = tmp_path / "textfile"  # node_exporter's --collector.textfile.directory
    textfile_dir.mkdir()
    textfile = textfile_dir / "bftrainer.prom"
    port = free_port()
    service.start("equal", extra=["--metrics-textfile", str(textfile), "--metrics-port", str(port)])
    # Said once the store is checked and the endpoint bound, which may come after the
    # daemon shows as up in status (it did, by a few milliseconds, under load).
    wait_until(lambda: "metrics: " in service.logs()[-1], 30, "the daemon's metrics line")
    t = service.submit("torchrun", 10_000_000, 4, "--step-delay-s", "0.1", "--max-batch", "128")
    wait_until(lambda: len(service.trainer(t)["nodes"]) == 4, 120, "the trainer on 4 nodes")
    wait_until(lambda: service.trainer(t)["samples_done"] > 0, 240, "the trainer training")
    endpoint, filed = agree(service, port, textfile, "one trainer on 4 nodes")
    for samples in (endpoint, filed):
        assert value(samples, "bftrainer_pool_nodes") == 8  # the whole idle cluster
        assert value(samples, "bftrainer_held_nodes") == 4  # only what the trainer can use
        assert value(samples, "bftrainer_trainers", state="running") == 1
        assert value(samples, "bftrainer_holders_acquired_total") >= 4
        assert value(samples, "bftrainer_decision_latency_seconds_count") >= 1
        assert value(samples, "bftrainer_pool_reading_age_seconds") < 15  # polled every 1 s
        for kind in COMMAND_ERROR_KINDS:
            assert value(samples, "bftrainer_scheduler_command_errors_total", operation=kind) == 0

    # A main job takes one of the trainer's nodes: its holder is preempted, the trainer
    # shrinks, and the daemon holds another idle node and grows it back (a rescale).
    taken = service.trainer(t)["nodes"][-1]
    service.main_job([taken], 120)
    wait_until(
        lambda: len(service.trainer(t)["nodes"]) == 4 and taken not in service.trainer(t)["nodes"],
        120,
        "the trainer back on 4 nodes without the main job's",
    )
    endpoint, filed = agree(service, port, textfile, "after a preemption")
    for samples in (endpoint, filed):
        assert value(samples, "bftrainer_pool_nodes") == 7
        assert value(samples, "bftrainer_holders_preempted_total") == 1
        assert value(samples, "bftrainer_holders_acquired_total") >= 5
        assert value(samples, "bftrainer_rescales_total") >= 1

    service.cli("cancel", t)
    wait_until(lambda: service.trainer(t)["state"] == "cancelled", 60, "the trainer cancelled")
    wait_until(lambda: not running_holders(service.cluster), 60, "the holders released")
    endpoint, filed = agree(service, port, textfile, "after the cancel")
    for samples in (endpoint, filed):
        assert value(samples, "bftrainer_trainers", state="cancelled") == 1
        assert value(samples, "bftrainer_holders_released_total") >= 4
    assert service.stop() == 0
    # The file stays after a clean stop, with the last figures; the port is closed.
    final = parse(textfile.read_text())
    assert value(final, "bftrainer_held_nodes") == 0
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert [p.name for p in textfile_dir.iterdir()] == ["bftrainer.prom"]
