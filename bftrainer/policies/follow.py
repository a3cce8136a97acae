"""A centre agent's policy: follow the allocator's assignment (docs/architecture.md,
"Centre mode"). The allocator alone decides; the agent's loop hands this policy the
assignment as one of its inputs (:class:`~bftrainer.loop.Assignment`), so it reads
nothing that another thread writes."""

from __future__ import annotations

from bftrainer.loop import Decision, PolicyInputs
from bftrainer.policies.registry import Admission


class FollowPolicy(Admission):
    """The agent's policy: each trainer gets the nodes the allocator assigned it
    (``inputs.assignment``, which the link's poll hands the loop as an
    :class:`~bftrainer.loop.Assignment`), those whose holder runs (in ``pool``); fewer
    than its minimum is none yet. A trainer the allocator has not decided on (new, or the
    allocator restarting) keeps what it has. The holders keep every node assigned to
    these trainers (``Decision.hold``)."""

    name = "centre"

    def decide(self, inputs: PolicyInputs) -> Decision:
        free = set(inputs.pool)
        out: dict[str, tuple[str, ...]] = {}
        hold: set[str] = set()
        assignment = inputs.assignment
        for t in inputs.trainers:
            wanted = assignment.get(t.id, t.nodes)
            hold.update(assignment.get(t.id, ()))
            mine = tuple(n for n in wanted if n in free)
            if len(mine) < t.job.n_min:
                mine = ()
            free -= set(mine)
            out[t.id] = mine
        return Decision(out, status="assigned", hold=frozenset(hold))
