"""Elastic Horovod's driver (``horovodrun``), reading its hosts without a process a second.

    BFTRAINER_DISCOVERY_HOSTS=FILE python -m bftrainer.trainers.launch.horovod_driver [args]

(``args``: horovodrun's.) Elastic ``horovodrun`` runs its host discovery script every
second, through ``safe_shell_exec``, which starts a fresh Python interpreter for each call
(multiprocessing's ``spawn``): measured here, about 0.25 s of CPU a second for every
Horovod trainer, a quarter of a core for as long as it runs, on the machine of its
supervisor (a login node runs many). Our discovery script only prints the supervisor's
copy of the hosts (``discover-hosts.sh``: ``cat FILE``), so this driver reads that file in
its own process and hands the text to Horovod's own parser; everything else is
``horovodrun`` unchanged, and without the variable it is exactly ``horovodrun``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from horovod.runner.elastic.discovery import HostDiscoveryScript
from horovod.runner.launch import run_commandline

from bftrainer.trainers.channel import DISCOVERY_HOSTS_VARIABLE as HOSTS_VARIABLE


def _read_hosts(self: HostDiscoveryScript) -> str:
    """What the discovery script would print: the hosts file's text. A file being
    replaced reads whole (the supervisor writes it atomically); a missing one raises,
    as the script's failure would."""
    return Path(os.environ[HOSTS_VARIABLE]).read_text()


def read_hosts_in_process() -> bool:
    """Have Horovod's discovery read the hosts file named by the environment, not run
    its script; False (Horovod unchanged) when no file is named."""
    if not os.environ.get(HOSTS_VARIABLE):
        return False
    HostDiscoveryScript._execute_discovery_script = _read_hosts
    return True


def main() -> int:
    read_hosts_in_process()
    sys.argv[0] = "horovodrun"
    return int(run_commandline() or 0)


if __name__ == "__main__":
    sys.exit(main())
