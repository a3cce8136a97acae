"""What every room of bftrainer shares, and nothing else of it: the leaf package.

``trainers/`` and ``idle_monitor/`` run on compute nodes and in the pool's readers, apart
from the daemon; of ``bftrainer/`` they may import only this package, and this package
imports nothing of bftrainer (tests/test_architecture.py checks both):

- :mod:`names`: the host, trainer and file names that reach a command line or the disk;
- :mod:`strict_json`: JSON without NaN or infinities, both ways;
- :mod:`limits`: the allocator's input limits that code outside ``milp/`` applies too;
- :mod:`squeue`: Slurm's ``squeue`` reply, parsed once for the daemon and the trainers;
- :mod:`promise`: a search trial's promise (rungs passed) as milp's weight, for the
  replay and the daemon;
- :mod:`plotting`: pyplot on the Agg backend, imported at the first plot.
"""
