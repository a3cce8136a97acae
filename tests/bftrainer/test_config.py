"""The configuration record: defaults, TOML files, flag overrides and their errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.policies.config import (
    POLICY_TABLES,
    Config,
    ConfigError,
    load_config,
    with_overrides,
)
from bftrainer.policies.registry import POLICIES, EqualSharePolicy, MilpPolicy, make_policy
from bftrainer.replay.run import REPLAY_TABLES, ReplayConfig


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bftrainer.toml"
    path.write_text(text)
    return path


def test_defaults_come_from_one_place() -> None:
    assert Config().t_fwd_s == "auto"  # from the pool's churn (tests/bftrainer/test_churn.py)
    assert ReplayConfig().t_fwd_s == "auto"
    assert Config().redecide_every_s == 60.0


def test_the_registry_builds_each_policy_with_the_record() -> None:
    config = Config(policy="milp", t_fwd_s=30.0, solver="dp", objective="goodput")
    policy = make_policy(config)
    assert isinstance(policy, MilpPolicy) and policy.config is config
    assert isinstance(make_policy(Config(policy="equal")), EqualSharePolicy)
    assert set(POLICIES) >= {"milp", "equal"}


def test_a_toml_file_sets_the_policy_table(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[policy]
policy = "equal"
solver = "dp"
t_fwd_s = 300          # an integer is fine for seconds
fairness_p = -1.0
fair_share_speedup = true
max_trainers = 4
redecide_every_s = 1e9
""",
    )
    c = load_config(path, Config())
    assert (c.policy, c.solver, c.t_fwd_s, c.max_trainers) == ("equal", "dp", 300.0, 4)
    assert isinstance(c.t_fwd_s, float)
    assert c.fairness_p == -1.0 and c.fair_share_speedup is True
    assert c.redecide_every_s == 1e9
    assert c.objective == "throughput"  # untouched keys keep their defaults


def test_the_replay_reads_its_own_table_too(tmp_path: Path) -> None:
    path = write(tmp_path, "[policy]\nsolver = 'dp'\n[replay]\nwindow_s = 3600\n")
    c = load_config(path, ReplayConfig(), REPLAY_TABLES)
    assert (c.solver, c.window_s) == ("dp", 3600.0)
    with pytest.raises(ConfigError, match=r"unknown table \[replay\]"):
        load_config(path, Config(), POLICY_TABLES)


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[policy]\nt_fwd_s = 300\nsolver = 'dp'\n")
    c = with_overrides(load_config(path, Config()), {"t_fwd_s": 60.0, "solver": None})
    assert (c.t_fwd_s, c.solver) == (60.0, "dp")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[policy]\ntfwd = 1\n", "[policy] unknown key 'tfwd'"),
        ("[polcy]\nsolver = 'dp'\n", "unknown table [polcy]"),
        ("solver = 'dp'\n", "key 'solver' is outside a table (expected policy)"),
        ("[policy]\nsolver = 'glpk'\n", "solver = 'glpk': expected one of highs"),
        ("[policy]\npolicy = 'greedy'\n", "policy = 'greedy': expected one of milp, equal"),
        ("[policy]\nt_fwd_s = -5\n", "t_fwd_s = -5.0: expected a number > 0"),
        ("[policy]\nt_fwd_s = nan\n", "t_fwd_s = nan: expected a finite number"),
        ("[policy]\ntime_limit_s = 0\n", "time_limit_s = 0.0: expected a number >= 0.01"),
        ("[policy]\nt_fwd_s = '120'\n", "t_fwd_s = '120': expected \"auto\" or seconds"),
        ("[policy]\nmax_trainers = 2.5\n", "max_trainers = 2.5: expected a whole number"),
        ("[policy]\nmax_trainers = 0\n", "max_trainers = 0: expected a whole number from 1 to"),
        ("[policy]\nfairness_p = 2\n", "fairness_p = 2.0: expected a number in [-10, 1]"),
        ("[policy]\nfair_share_speedup = 1\n", "fair_share_speedup = 1: expected true or false"),
        ("[policy]\nredecide_every_s = -1\n", "redecide_every_s = -1.0: expected a number >= 0"),
        ("[policy\n", "not valid TOML"),
    ],
)
def test_bad_files_get_one_line_naming_file_key_and_value(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path, Config())
    assert str(path) in str(err.value)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_missing_or_binary_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: No such file"):
        load_config(tmp_path / "nope.toml", Config())
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match=r"bin\.toml: not a UTF-8 text file"):
        load_config(binary, Config())


def test_a_bad_flag_value_names_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"--tfwd: t_fwd_s = -1\.0"):
        with_overrides(Config(), {"t_fwd_s": -1.0}, {"t_fwd_s": "--tfwd"})


def replay_cli(tmp_path: Path, *args: str) -> tuple[int, str, list[dict[str, object]]]:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        [
            "replay",
            "--synthetic-nodes",
            "32",
            "--synthetic-hours",
            "1",
            "--jobs-count",
            "5",
            "--no-progress",
            "--out",
            str(out),
            *args,
        ],
    )
    summary = out / "summary.json"
    runs: list[dict[str, object]] = []
    if result.exit_code == 0:
        data = json.loads(summary.read_text())
        runs = data.get("runs", [data])
    return result.exit_code, result.output, runs


def test_replay_takes_the_config_file_and_flags_win(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[policy]\npolicy = 'milp'\nsolver = 'dp'\nt_fwd_s = 30\n[replay]\nwindow_s = 1800\n",
    )
    code, output, runs = replay_cli(tmp_path, "--config", str(path), "--tfwd", "60")
    assert code == 0, output
    (run,) = runs
    assert (run["policy"], run["solver"], run["t_fwd"], run["window_hours"]) == (
        "milp",
        "dp",
        60.0,
        0.5,
    )


def test_replay_with_a_bad_config_file_exits_2_with_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "[policy]\nsolver = 'glpk'\n")
    code, output, _ = replay_cli(tmp_path, "--config", str(path))
    assert code == 2
    assert f"{path}: [policy] solver = 'glpk'" in output


def test_the_daemon_refuses_a_replay_only_policy(tmp_path: Path) -> None:
    # The scavenger baseline kills and requeues rigid jobs: a model, not something the
    # live driver can do to elastic trainers.
    from bftrainer.daemon import load_daemon_config

    config = tmp_path / "d.toml"
    config.write_text('[policy]\npolicy = "scavenger"\n')
    with pytest.raises(ConfigError, match=r"d\.toml: policy = 'scavenger': the daemon runs"):
        load_daemon_config(config, {})
    result = CliRunner().invoke(
        cli, ["daemon", "--scheduler", "slurm", "--bf-partition", "bf", "--policy", "scavenger"]
    )
    assert result.exit_code == 2 and "'scavenger' is not one of" in result.output


def test_the_daemon_takes_slots_per_node_from_its_table_or_the_flag(tmp_path: Path) -> None:
    from bftrainer.daemon import load_daemon_config

    config = tmp_path / "d.toml"
    config.write_text("[daemon]\nslots_per_node = 4\n")
    assert load_daemon_config(config, {}).slots_per_node == 4
    assert load_daemon_config(config, {"slots_per_node": 2}).slots_per_node == 2
    assert load_daemon_config(None, {}).slots_per_node == 1
    config.write_text("[daemon]\nslots_per_node = 0\n")
    with pytest.raises(ConfigError, match=r"d\.toml: \[daemon\] slots_per_node = 0: expected"):
        load_daemon_config(config, {})
    result = CliRunner().invoke(
        cli, ["daemon", "--scheduler", "slurm", "--bf-partition", "bf", "--slots-per-node", "0"]
    )
    assert result.exit_code == 2 and "--slots-per-node" in result.output
    assert len([line for line in result.output.splitlines() if "Error" in line]) == 1


@pytest.mark.parametrize("lease", ["1e300", "604801", "inf"])
def test_the_daemon_refuses_a_holder_lease_that_bounds_nothing(tmp_path: Path, lease: str) -> None:
    """A lease is how long a node stays held for nobody once the daemon is gone: one
    over a week is refused in one line (1e300 s was taken, and held as if unleased)."""
    from bftrainer.daemon import load_daemon_config

    config = tmp_path / "d.toml"
    config.write_text(f"[daemon]\nholder_lease_s = {lease}\n")
    with pytest.raises(ConfigError, match=r"d\.toml: \[daemon\] holder_lease_s = .*expected"):
        load_daemon_config(config, {})
    config.write_text("[daemon]\nholder_lease_s = 604800\n")
    assert load_daemon_config(config, {}).holder_lease_s == 604800.0


@pytest.mark.parametrize(
    "scheduler", [["slurm", "--bf-partition", "bf"], ["lsf", "--bf-queue", "q"]]
)
def test_the_daemon_refuses_a_missing_holder_script_at_start(
    tmp_path: Path, scheduler: list[str]
) -> None:
    """Else sbatch/bsub would fail on every holder, one poll after another, for good."""
    missing = tmp_path / "hold.sbatch"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bftrainer",
            "daemon",
            "--scheduler",
            *scheduler,
            "--holder-script",
            str(missing),
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stderr.splitlines() == [f"Error: --holder-script {missing}: not a file"]
    assert not (tmp_path / "state").exists(), "nothing is started or written"
