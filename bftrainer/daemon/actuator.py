"""The daemon's actuator: one part that records a step's orders and carries them out.

The loop hands it the step's :class:`~bftrainer.loop.Orders` twice: inside the step's
transaction (``record``: the live driver writes each trainer's nodes, slots and state)
and after the commit (``act``: the live driver starts, tells and stops supervisors, the
held pool runs the holder commands of its plan, ``Orders.hold``). What the actions learnt
comes back at the next step's start (``learn``), in that step's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from bftrainer.daemon.held_pool import HeldPool
from bftrainer.daemon.live_driver import LiveDriver
from bftrainer.loop import Orders


class StepActuator:
    """Records and carries out the daemon's orders (see the module docstring)."""

    def __init__(self, driver: LiveDriver, pool: HeldPool) -> None:
        self.driver = driver
        self.pool = pool

    def learn(self, report: Sequence[object]) -> None:
        self.driver.learn(report)  # each takes what is its own
        self.pool.learn(report)

    def record(self, orders: Orders) -> None:
        self.driver.record(orders)

    def act(self, orders: Orders) -> Sequence[object]:
        return [*self.driver.act(orders), *self.pool.act(orders.hold)]
