"""One validator for host names, trainer ids and counts (bftrainer/common/names.py), at every
place they enter: hosts files and `bftrainer run` (run as a user runs it), --trainer-id,
pool --ssh, submit's counts, the scheduler's node names. Each refusal is one line."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from bftrainer.common.names import (
    MAX_SLOTS,
    BadNameError,
    check_host,
    check_slots,
    check_trainer_id,
    trainer_id_from,
)
from bftrainer.idle_monitor.lsf import parse_bhosts
from bftrainer.idle_monitor.runner import SshTarget
from bftrainer.idle_monitor.slurm import parse_sinfo_kinds
from bftrainer.idle_monitor.source import OutputParseError
from bftrainer.trainers import channel
from bftrainer.trainers.launch.base import LaunchError, LaunchSpec

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_mlp.py"
BFTRAINER = [sys.executable, "-m", "bftrainer"]

BAD_HOSTS = [
    "-oProxyCommand=touch /tmp/pwned",
    "-x",
    "../etc",
    "a/b",
    "host name",
    "h\x00st",
    "nöde1",
    "x" * 300,
]


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("Error")]
    return line


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*BFTRAINER, "run", "--backend", "torchrun", "--hosts-file", "hosts", *args]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("host", BAD_HOSTS)
def test_a_bad_host_is_refused_everywhere(host: str) -> None:
    with pytest.raises(BadNameError):
        check_host(host)
    with pytest.raises(channel.ChannelError, match="hosts:1"):
        channel.parse_hosts(f"{host}:2\n", "hosts")
    with pytest.raises(ValueError):
        SshTarget.parse(f"alice@{host}")
    if not any(c.isspace() or c == "\x00" for c in host):  # one field of the scheduler's
        with pytest.raises(OutputParseError, match="host name"):
            parse_sinfo_kinds(f"{host}|idle\n")
        bhosts = "HOST_NAME STATUS JL/U MAX NJOBS RUN SSUSP USUSP RSV\n"
        with pytest.raises(OutputParseError, match="host name"):
            parse_bhosts(bhosts + f"{host} ok - 4 0 0 0 0 0\n")


@pytest.mark.parametrize("trainer_id", ["../evil", "/abs", "a/b", "..", ".", "-rf", "", "a b"])
def test_a_bad_trainer_id_is_refused(trainer_id: str) -> None:
    with pytest.raises(BadNameError):
        check_trainer_id(trainer_id)
    spec = LaunchSpec(trainer_id, EXAMPLE, (), Path("d"), "torchrun")
    with pytest.raises(LaunchError, match="trainer id"):
        spec.check()


def test_good_names_pass_and_a_scripts_name_makes_an_id() -> None:
    for host in ("localhost", "node001", "nid00012.hsn", "10.0.0.7", "gpu-a_1"):
        assert check_host(host) == host
    assert check_trainer_id("t0001") == "t0001"
    assert trainer_id_from("my train (v2)") == "my-train--v2-"
    assert trainer_id_from("..") == "trainer"
    assert check_slots("8") == 8 and check_slots(MAX_SLOTS) == MAX_SLOTS
    assert channel.parse_hosts("a\nb:4 # four\n") == [("a", 1), ("b", 4)]


@pytest.mark.parametrize("slots", ["0", "-1", "99999999999999999999", "1025", "1e3", "", "x"])
def test_slot_counts_are_bounded(slots: str) -> None:
    with pytest.raises(channel.ChannelError, match="slot count"):
        channel.parse_hosts(f"localhost:{slots}\n", "hosts")


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"-oProxyCommand=x\n", "starts with '-'"),
        (b"localhost:99999999999999999999\n", "slot count 99999999999999999999: expected 1 to"),
        (b"\xff\xfenode1\n", "not UTF-8"),
        (b"../evil\n", "bad host name"),
    ],
)
def test_run_refuses_a_bad_hosts_file_in_one_line_naming_it(
    tmp_path: Path, content: bytes, says: str
) -> None:
    (tmp_path / "hosts").write_bytes(content)
    line = one_error_line(run(tmp_path, str(EXAMPLE)))
    assert "hosts" in line and says in line, line
    assert not (tmp_path / "bftrainer-run-train_mlp").exists()  # refused before any work


def test_run_refuses_a_trainer_id_that_is_a_path(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("localhost\n")
    line = one_error_line(run(tmp_path, "--trainer-id", "../evil", str(EXAMPLE)))
    assert "--trainer-id" in line and "'../evil'" in line, line
    assert list(tmp_path.iterdir()) == [tmp_path / "hosts"]


def test_node_counts_and_ssh_targets_are_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("localhost\n")
    line = one_error_line(run(tmp_path, "--max-hosts", "99999999999999999999", str(EXAMPLE)))
    assert "--max-hosts" in line, line
    done = subprocess.run(
        [*BFTRAINER, "pool", "--scheduler", "slurm", "--ssh", "-oProxyCommand=x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = one_error_line(done)
    assert "--ssh" in line, line
    for flag in ("--max-nodes", "--min-nodes", "--work-samples"):
        done = subprocess.run(
            [
                *BFTRAINER,
                "submit",
                str(EXAMPLE),
                flag,
                "1" + "0" * 30,
                "--state-dir",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert flag in one_error_line(done)


@pytest.mark.slow
def test_a_hosts_file_rewritten_with_bad_bytes_mid_run_keeps_the_previous_hosts(
    tmp_path: Path,
) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\n")
    argv = [*BFTRAINER, "run", "--backend", "torchrun", "--hosts-file", "hosts"]
    proc = subprocess.Popen(
        [*argv, str(EXAMPLE), "--work-samples", "20000"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    trainer_dir = tmp_path / "bftrainer-run-train_mlp"
    deadline = time.monotonic() + 120
    while not (trainer_dir / channel.SUPERVISOR_PID).exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the run did not start"
        time.sleep(0.1)
    hosts.write_bytes(b"local\xffhost\n")  # the run reads it within its poll
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    (refused,) = [ln for ln in err.splitlines() if "not UTF-8" in ln]
    assert str(hosts.name) in refused and "keeping the previous hosts" in refused
    assert '"samples": 20000' in out
