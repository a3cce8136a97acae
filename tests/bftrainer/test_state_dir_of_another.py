"""Another user's state directory, named with ``--state-dir``: refused in one line that
says whose it is, by every command that reads one (as a real second account would see
it; the centre soak asks so at random, benchmarks/centre_soak.py)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.bftrainer.centre_service import NoAccounts, python_for_all


@pytest.mark.parametrize("verb", ["status", "logs", "cancel"])
def test_another_users_state_dir_is_refused_in_one_line(verb: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs a command as another account: needs root")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no account 'nobody' on this machine")
    # As in /home: the folder above is searchable, the state directory root's alone.
    home = Path(tempfile.mkdtemp(prefix="bft-home-", dir="/tmp"))
    home.chmod(0o755)
    theirs = home / "state"
    theirs.mkdir(mode=0o700)
    try:
        with python_for_all() as python:
            done = subprocess.run(
                [python, "-m", "bftrainer", verb, "t0001", "--state-dir", str(theirs)],
                capture_output=True,
                text=True,
                user=nobody.pw_uid,
                group=nobody.pw_gid,
                extra_groups=[],
                cwd="/",
                env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
                timeout=120,
                check=False,
            )
    except NoAccounts as exc:
        pytest.skip(str(exc))
    finally:
        shutil.rmtree(home)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"Error: state directory {theirs} belongs to uid 0, not to you (uid {nobody.pw_uid}): "
        "use your own (--state-dir or $BFTRAINER_STATE_DIR) (is a daemon set up? see "
        "bftrainer daemon --help)"
    ], done.stderr
