"""The core loop: one driving function for the daemon (live) and the replay (offline).

:func:`run` (or :class:`Loop`, one step at a time) owns the order of a step; the two
modes differ only in what is plugged in:

- **Sources** (:class:`Source`, one method, as Horovod's ``HostDiscovery``):
  ``poll(now_s)`` returns the typed inputs due by ``now_s`` -- :class:`PoolChange`,
  :class:`Arrival`, :class:`Cancel` (and, from a source that reads trainers' reports,
  :class:`CurveReport` and :class:`Completion`; :class:`Redecide` when the policy's own
  input moved) -- and when it wants to be polled next.
  Replay: a trace and a job list (:class:`TimedSource`). Daemon: the live pool source,
  the SQLite queue of submissions and cancels, the trainers' report files, each
  polling on its own interval; :class:`Inbox` for inputs pushed from other threads.
- **Clock** (:class:`Clock`): :class:`VirtualClock` jumps to the next input or
  wake-up; :class:`WallClock` sleeps until then, and ``wake()`` cuts the sleep short.
- **Driver** (:class:`TrainerDriver`): acts on trainers. ``advance(running, now_s)``
  lets them progress to ``now_s`` and returns their :class:`Progress`, with curve
  reports and completions as inputs (a driver never writes a trainer's curves or retires
  it itself); ``next_wakeup_s`` says when it next has something to report (a completion
  at current rates, a report timer). A wake-up is not an event: nothing is recorded
  unless it brings an input or a decision. Its ``rescale``/``preempt``/``cancel`` are a
  simulated trainer's cost accounting: what a step decided is its :class:`Orders`.
- **Policy** (:class:`Policy`): pure; admits the trainers that take part, and decides
  their node sets from :class:`PolicyInputs`, all of which the loop hands it: the pool,
  the admitted trainers with their curves, the pool's churn
  (:class:`~bftrainer.loop.churn.Churn`: the loop's rolling window of the pool changes it
  applied, the same in both modes; the milp policy's ``t_fwd_s = "auto"`` reads it), the
  loop's time, and what came as inputs (:class:`Assignment` to follow, :class:`Refused`
  nodes with their times).

The package shows those parts: ``records`` (the data a step exchanges), ``protocols``
(the seams above), ``clocks``, ``sources`` (the generic ones) and ``core`` (the
:class:`Loop` and the order of its step; read its docstring for that order). Import
from ``bftrainer.loop``: every public name is here.

**For the daemon.** Build a :class:`Loop` with the live sources, the live driver, a
:class:`WallClock`, the :class:`~bftrainer.policies.config.Config` and the policy
(``bftrainer.policies.registry.make_policy(config)``); call ``loop.run()`` (until
``request_stop()``, e.g. from a SIGTERM handler, which also wakes the clock) or
``loop.step()`` for one step. The observer's ``step`` is the place to persist: after it,
``loop.state()`` is a :class:`LoopState` (time, pool, unfinished trainers with their
nodes and progress, finished ones, the last decision's time). After a restart, pass
the :class:`LoopState` rebuilt from those records as ``state=``: the first step then
decides again (keeping current nodes wherever the policy's costs say so) before any
new input is needed. Live sources report changes relative to the restored pool. The
daemon also names its ``readers`` (asked before each step's transaction), its
``planner`` (the hold plan, on each decision) and its ``actuator``, which records each
step's :class:`Orders` inside the transaction and carries them out after the commit
(``bftrainer.daemon.actuator``).
"""

from bftrainer.loop.clocks import VirtualClock, WallClock
from bftrainer.loop.core import MAX_STALLED_STEPS, Loop, run
from bftrainer.loop.held_wait import WAIT_FOR_HELD_S
from bftrainer.loop.protocols import (
    Actuator,
    Clock,
    Observer,
    Planner,
    Policy,
    Reader,
    Source,
    TrainerDriver,
)
from bftrainer.loop.records import (
    Arrival,
    Assignment,
    Cancel,
    Completion,
    Curve,
    CurveReport,
    Decision,
    Demand,
    Input,
    LoopError,
    LoopStalledError,
    LoopState,
    LoopView,
    NodeChange,
    Orders,
    Planned,
    PolicyInputs,
    Polled,
    PoolChange,
    Progress,
    Redecide,
    Refused,
    Step,
    TrainerState,
)
from bftrainer.loop.sources import WINDOW_TOLERANCE_S, Inbox, TimedSource, departure_moved

__all__ = [
    "MAX_STALLED_STEPS",
    "WAIT_FOR_HELD_S",
    "WINDOW_TOLERANCE_S",
    "Actuator",
    "Arrival",
    "Assignment",
    "Cancel",
    "Clock",
    "Completion",
    "Curve",
    "CurveReport",
    "Decision",
    "Demand",
    "Inbox",
    "Input",
    "Loop",
    "LoopError",
    "LoopStalledError",
    "LoopState",
    "LoopView",
    "NodeChange",
    "Observer",
    "Orders",
    "Planned",
    "Planner",
    "Policy",
    "PolicyInputs",
    "Polled",
    "PoolChange",
    "Progress",
    "Reader",
    "Redecide",
    "Refused",
    "Source",
    "Step",
    "TimedSource",
    "TrainerDriver",
    "TrainerState",
    "VirtualClock",
    "WallClock",
    "departure_moved",
    "run",
]
