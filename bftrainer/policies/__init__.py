"""The policies: pure functions of what the loop hands them (docs/architecture.md).

A policy admits (which unfinished trainers take part) and decides
(``decide(inputs) -> Decision``, from one :class:`~bftrainer.loop.PolicyInputs`); it
reads no clock and no table another thread writes, in the daemon, the centre and the
replay alike. Import each from its module (this package imports nothing, so that
``config`` stays light for the command line):

- :mod:`~bftrainer.policies.registry`: ``milp``, ``equal`` and ``scavenger``, the
  registry ``POLICIES`` and ``make_policy``, and admission;
- :mod:`~bftrainer.policies.follow`: a centre agent's ``FollowPolicy``;
- :mod:`~bftrainer.policies.refusing`: the centre allocator's ``Refusing`` wrapper;
- :mod:`~bftrainer.policies.config`: the ``[policy]`` configuration record.
"""
