"""torchrun's agent (``torch.distributed.run``), ending at once when its node is taken.

    python -m bftrainer.trainers.launch.torchrun_agent [torchrun's arguments]

On SIGTERM (a Slurm preemption signals every process of the step) torchrun's agent stops
its workers, then leaves through the interpreter's teardown: 0.86 s more, measured on
these machines, during which the main job that preempted the node cannot start. This
runs the same agent and exits as soon as it has stopped its workers.

The supervisor has the agent fork its workers (``--run-path --start-method=fork``), so
what the agent has imported the workers have too: torch, and what every worker imports
next (an optimizer imports ``torch._dynamo``; the runtime), once per agent instead of
once per worker. A rescale starts every worker again: the 1-3-2-1 rescale test
(``tests/trainers/test_elastic_torchrun.py``) takes 33 s of CPU instead of 45 s.
Nothing here initialises CUDA or a process group, so a forked worker starts both
afresh.
"""

from __future__ import annotations

import os
import sys

import torch._dynamo  # noqa: F401  (for the workers: see the docstring)
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main as torchrun_main

import bftrainer.trainers.runtime  # noqa: F401  (for the workers)

TERMINATED = 143  # 128 + SIGTERM, as torchrun's own exit on a signal


def main() -> None:
    try:
        torchrun_main()
    except SignalException:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(TERMINATED)


if __name__ == "__main__":
    main()
