"""The daemon: the core loop on the wall clock, on the nodes its holder jobs keep.

One module per part, so that each reads on its own:

- :mod:`~bftrainer.daemon.config`: its settings (``[policy]`` and ``[daemon]``);
- :mod:`~bftrainer.daemon.held_pool`: the pool source, the nodes whose holder runs, and
  the holders' record (submit, cancel, leases, counts);
- :mod:`~bftrainer.daemon.queue`: trainers submitted and cancels requested;
- :mod:`~bftrainer.daemon.daemon`: the :class:`Daemon` that wires them to the loop,
  restores after a restart and stops cleanly;
- :mod:`~bftrainer.daemon.centre_link`: what a centre agent plugs in.

The names callers use are exported here.
"""

from bftrainer.daemon.centre_link import CentreLink
from bftrainer.daemon.config import DAEMON_TABLES, GRES, DaemonConfig, load_daemon_config
from bftrainer.daemon.daemon import Daemon, state_unwritable
from bftrainer.daemon.held_pool import HeldPool, leave_by_s
from bftrainer.daemon.queue import UNFINISHED, SubmissionQueue

__all__ = [
    "DAEMON_TABLES",
    "GRES",
    "UNFINISHED",
    "CentreLink",
    "Daemon",
    "DaemonConfig",
    "HeldPool",
    "SubmissionQueue",
    "leave_by_s",
    "load_daemon_config",
    "state_unwritable",
]
