"""The daemon's actuator: one part that records a step's orders and carries them out.

The loop hands it the step's :class:`~bftrainer.loop.Orders` twice: inside the step's
transaction (``record``: the orders kept as one record, the order log's, and the live
driver writes each trainer's nodes, slots and state) and after the commit (``act``: the
live driver starts, tells and stops supervisors, the held pool runs the holder commands
of its plan, ``Orders.hold``). What the actions learnt comes back at the next step's
start (``learn``), in that step's transaction, with the kept orders marked done. A
daemon killed in between leaves them not done: its next start carries them out
(``redo``) before it restores the trainers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from bftrainer.daemon.held_pool import HeldPool
from bftrainer.daemon.hold_orders import EndHolders
from bftrainer.daemon.live_driver import LiveDriver
from bftrainer.daemon.live_orders import EndLeftovers
from bftrainer.daemon.order_log import KEPT_STEPS, encode, readable, worth_keeping
from bftrainer.loop import Orders
from bftrainer.state import Store
from bftrainer.trainers.launch.base import Launcher

log = logging.getLogger(__name__)

# Holder ends a restart does again: those the store recorded (a stray's or an unrecorded
# holder's is found again by the start's status call, which ends it).
_RECORDED_ENDS = ("release", "stuck", "requeued")


@dataclass(frozen=True)
class OrdersDone:
    """Learnt: the kept orders were carried out."""


class StepActuator:
    """Records and carries out the daemon's orders (see the module docstring)."""

    def __init__(self, driver: LiveDriver, pool: HeldPool, store: Store) -> None:
        self.driver = driver
        self.pool = pool
        self.store = store

    def learn(self, report: Sequence[object]) -> None:
        self.driver.learn(report)  # each takes what is its own
        self.pool.learn(report)
        if any(isinstance(fact, OrdersDone) for fact in report):
            self.store.orders_done(now_s=time.time(), keep=KEPT_STEPS)

    def record(self, orders: Orders) -> None:
        if worth_keeping(orders):
            self.store.add_orders(encode(orders), now_s=orders.time_s)
        self.driver.record(orders)

    def act(self, orders: Orders) -> Sequence[object]:
        done = [OrdersDone()] if worth_keeping(orders) else []
        return [*self.driver.act(orders), *self.pool.act(orders.hold), *done]

    def redo(self) -> Sequence[object]:
        """At the daemon's start, after the holders' status call and before the
        trainers' restore: carry out what kept orders not marked done ask and the
        restore does not do from the trainers' record: end the holders they ended (those
        the store still holds live) and a dead supervisor's leftovers (unless a
        supervisor runs there again: the leftovers went before it started). Their
        trainers' starts, hosts and stops are the record, which the restore brings about;
        an ``Acquire`` is not redone: the restart plans its holders on the pool as it is.
        What it learnt, with the orders marked done, for :meth:`learn`."""
        rows = self.store.orders(undone_only=True)
        if not rows:
            return []
        undone = readable(rows, self.store.path)
        live = {h.job_id for h in self.store.holders(live_only=True)}
        ends: list[EndHolders] = []
        for orders in undone:
            for order in orders.hold if isinstance(orders.hold, tuple) else ():
                if isinstance(order, EndHolders) and order.kind in _RECORDED_ENDS:
                    ids = tuple(j for j in order.job_ids if j in live)
                    if ids:
                        ends.append(replace(order, job_ids=ids))
        leftovers = tuple(
            order
            for orders in undone
            for order in orders.driver
            if isinstance(order, EndLeftovers)
            and Launcher.running_in(order.launcher.trainer_dir) is None
        )
        log.info(
            "the daemon before stopped before it carried out %d step(s) of orders: "
            "ending %d holder(s) and %d trainer(s)' leftovers as they said",
            len(undone),
            sum(len(e.job_ids) for e in ends),
            len(leftovers),
        )
        acted = self.driver.act(Orders(time.time(), driver=leftovers))
        return [*acted, *self.pool.act(tuple(ends)), OrdersDone()]
