"""The Pollux-profiled replay (docs/goodput-replay.md): Pollux's applications as
trainers that report goodput, on the same core loop as every other replay.

- :mod:`~bftrainer.replay.pollux.workload`: the workload (Pollux's job list, or made);
- :mod:`~bftrainer.replay.pollux.app` and :mod:`~bftrainer.replay.pollux.curves`: an
  application's profile and the curves it gives;
- :mod:`~bftrainer.replay.pollux.trainer` and :mod:`~bftrainer.replay.pollux.sim`: one
  trainer, and the driver ``PolluxSimDriver``;
- :mod:`~bftrainer.replay.pollux.series`, :mod:`~bftrainer.replay.pollux.output` and
  :mod:`~bftrainer.replay.pollux.plots`: what a run writes.
"""
