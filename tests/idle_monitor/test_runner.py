"""The command runners: argument lists reach the program verbatim, locally and over a
real sshd; failures, timeouts and retries are typed and name the command."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bftrainer.idle_monitor.runner import (
    CommandFailedError,
    CommandStartError,
    CommandTimeoutError,
    HostKeyError,
    LocalRunner,
    ProgramNotFoundError,
    ReplayRunner,
    RetryPolicy,
    SshRunner,
    SshTarget,
    recorded,
)
from tests.conftest import SshServer, _free_port

# Arguments a shell would split, expand or execute; they must arrive unchanged.
NASTY = ["a b", "$(touch /tmp/bftrainer-pwned)", "x;y", "'q'", '"dq"', "*", "", "`id`", "\\n"]
PRINT_ARGS = [sys.executable, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))"]


def test_local_arguments_arrive_verbatim() -> None:
    result = LocalRunner().run([*PRINT_ARGS, *NASTY])
    assert result.returncode == 0
    assert result.stdout.strip() == json.dumps(NASTY)
    assert not Path("/tmp/bftrainer-pwned").exists()
    assert result.argv[-len(NASTY) :] == tuple(NASTY)


def test_local_env_is_added() -> None:
    code = "import os; print(os.environ['A'], os.environ['B'])"
    runner = LocalRunner(env={"A": "from-runner"})
    assert runner.run([sys.executable, "-c", code], env={"B": "x y"}).stdout == "from-runner x y\n"


def test_string_argv_is_refused() -> None:
    with pytest.raises(TypeError, match="list of arguments"):
        LocalRunner().run("sinfo -N")


def test_nonzero_exit_names_command_and_stderr() -> None:
    code = "import sys; sys.stderr.write('slurm_load_partitions: boom\\n'); sys.exit(3)"
    runner = LocalRunner(retry=RetryPolicy(attempts=1))
    with pytest.raises(CommandFailedError) as err:
        runner.run([sys.executable, "-c", code])
    msg = str(err.value)
    assert "exit code 3" in msg and "slurm_load_partitions: boom" in msg and "-c" in msg
    assert err.value.result.returncode == 3
    assert runner.run([sys.executable, "-c", code], check=False).returncode == 3


def test_timeout_stops_the_command() -> None:
    runner = LocalRunner(timeout_s=0.3, retry=RetryPolicy(attempts=1))
    with pytest.raises(CommandTimeoutError, match=r"timed out after 0.3 s") as err:
        runner.run(["sleep", "30"])
    assert err.value.argv == ("sleep", "30")


def test_transient_failure_is_retried_with_backoff(tmp_path: Path) -> None:
    marker = tmp_path / "failed-once"
    code = (
        f"import os, sys; p={str(marker)!r}; ok=os.path.exists(p); open(p, 'a'); "
        "sys.exit(0 if ok else 1)"
    )
    slept: list[float] = []
    runner = LocalRunner(retry=RetryPolicy(attempts=3, backoff_s=0.5), sleep=slept.append)
    result = runner.run([sys.executable, "-c", code])
    assert result.returncode == 0 and result.attempts == 2
    assert slept == [0.5]


def test_retries_are_bounded() -> None:
    slept: list[float] = []
    runner = LocalRunner(
        retry=RetryPolicy(attempts=3, backoff_s=1.0, factor=2.0), sleep=slept.append
    )
    with pytest.raises(CommandFailedError):
        runner.run(["false"])
    assert slept == [1.0, 2.0]


def test_missing_program_is_not_retried() -> None:
    slept: list[float] = []
    runner = LocalRunner(retry=RetryPolicy(attempts=5), sleep=slept.append)
    with pytest.raises(ProgramNotFoundError, match="no-such-sinfo"):
        runner.run(["no-such-sinfo", "-N"])
    assert slept == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("alice@login1", SshTarget("alice", "login1", 22)),
        ("alice@login1.example.org:2222", SshTarget("alice", "login1.example.org", 2222)),
        ("bob@[::1]:22", SshTarget("bob", "::1", 22)),
    ],
)
def test_ssh_target_parse(text: str, expected: SshTarget) -> None:
    assert SshTarget.parse(text) == expected


@pytest.mark.parametrize("text", ["alice@", "a@b:c", "a b@c", "a@b:70000"])
def test_ssh_target_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="SSH"):
        SshTarget.parse(text)


def test_ssh_wire_command_quotes_every_argument() -> None:
    runner = SshRunner("u@h", env={"SLURM_CONF": "/a b/slurm.conf"})
    wire = runner.wire_command(["squeue", "-o", "%i|%P", "$(id)"])
    assert wire == "env 'SLURM_CONF=/a b/slurm.conf' squeue -o '%i|%P' '$(id)'"


def test_replay_runner_serves_recordings_in_order() -> None:
    runner = ReplayRunner({"sinfo": [recorded("a"), recorded(stderr="down", returncode=1)]})
    assert runner.run(["sinfo"]).stdout == "a"
    with pytest.raises(CommandFailedError, match="down"):
        runner.run(["sinfo"])
    with pytest.raises(ProgramNotFoundError):
        runner.run(["squeue"])


# ---------------------------------------------------------------------- a real sshd


@pytest.mark.sshd
def test_ssh_arguments_arrive_verbatim(sshd: SshServer) -> None:
    with SshRunner(sshd.target, key_path=sshd.key, known_hosts=sshd.known_hosts) as runner:
        result = runner.run(
            ["python3", "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *NASTY]
        )
        assert result.returncode == 0
        assert result.stdout.strip() == json.dumps(NASTY)
        assert not Path("/tmp/bftrainer-pwned").exists()
        # the connection is reused, and env reaches the command
        env = runner.run(["sh", "-c", 'echo "$SLURM_CONF"'], env={"SLURM_CONF": "/x y"})
        assert env.stdout == "/x y\n"


@pytest.mark.sshd
def test_ssh_exit_code_and_stderr(sshd: SshServer) -> None:
    runner = SshRunner(
        sshd.target, key_path=sshd.key, known_hosts=sshd.known_hosts, retry=RetryPolicy(1)
    )
    with pytest.raises(CommandFailedError, match="exit code 4: oops") as err:
        runner.run(["sh", "-c", "echo oops >&2; exit 4"])
    assert sshd.target.split("@")[1] in str(err.value)
    runner.close()


@pytest.mark.sshd
def test_ssh_timeout(sshd: SshServer) -> None:
    runner = SshRunner(
        sshd.target,
        key_path=sshd.key,
        known_hosts=sshd.known_hosts,
        timeout_s=0.5,
        retry=RetryPolicy(1),
    )
    with pytest.raises(CommandTimeoutError, match=r"timed out after 0\.5 s"):
        runner.run(["sleep", "20"])
    assert runner.run(["true"], timeout_s=10).returncode == 0  # usable afterwards
    runner.close()


@pytest.mark.sshd
def test_ssh_unknown_host_key_is_rejected(sshd: SshServer, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    slept: list[float] = []
    runner = SshRunner(
        sshd.target, key_path=sshd.key, known_hosts=empty, retry=RetryPolicy(3), sleep=slept.append
    )
    with pytest.raises(HostKeyError, match="not in"):
        runner.run(["true"])
    assert slept == []  # a rejected host key is not retried


@pytest.mark.sshd
def test_ssh_changed_host_key_is_rejected(sshd: SshServer, tmp_path: Path) -> None:
    other = tmp_path / "other"

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, key = other.with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {kind} {key}\n")
    runner = SshRunner(sshd.target, key_path=sshd.key, known_hosts=known, retry=RetryPolicy(1))
    with pytest.raises(HostKeyError, match="does not match"):
        runner.run(["true"])


@pytest.mark.sshd
def test_ssh_connection_refused(sshd: SshServer) -> None:
    runner = SshRunner(
        f"{sshd.user}@127.0.0.1:{_free_port()}",
        key_path=sshd.key,
        known_hosts=sshd.known_hosts,
        retry=RetryPolicy(1),
    )
    with pytest.raises(CommandStartError, match="cannot connect"):
        runner.run(["true"])


@pytest.mark.parametrize("timeout_s", [0.0, -1.0, math.nan, 1e12])
def test_a_timeout_no_wait_can_hold_is_refused(timeout_s: float) -> None:
    """subprocess's wait overflows near 1e10 s: a traceback at the first command."""
    with pytest.raises(ValueError, match="timeout_s must be > 0 and <= 86400"):
        LocalRunner(timeout_s=timeout_s)
