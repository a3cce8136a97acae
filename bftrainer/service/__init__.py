"""What the daemon and the centre's allocator share: both run the core loop live,
on the wall clock, on a pool their scheduler reports (docs/architecture.md).

- :mod:`~bftrainer.service.base`: ``LiveService`` (the stop request, trying the
  scheduler until it answers) and ``StepObserver`` (after each step);
- :mod:`~bftrainer.service.pool_changes`: the pool diff of both pool sources;
- :mod:`~bftrainer.service.curves`: the throughput curves both plan on (the replay's rule);
- :mod:`~bftrainer.service.reading` and :mod:`~bftrainer.service.metrics`: the figures
  both hand their metrics, and their Prometheus rendering.

What only the daemon runs is in :mod:`bftrainer.daemon`, what only the centre runs in
:mod:`bftrainer.centre`.
"""
