"""Evaluators: one lifetime of one candidate -> one ``Observation``.

They join the stages (artifacts -> runtime -> probe -> verdict) behind the small ``Evaluator``
interface (``bisect_tool.interfaces``), so the engine never touches git worktrees, HTTP or Docker
itself. An evaluator never raises for a candidate's own failure: that is an UNTESTABLE
observation. Infrastructure failures (``InfrastructureError``) and aborts propagate: they are
never verdicts.

- ``server``: a fresh server lifetime and the determinism probe; the controls;
- ``op``: the focused op check on a candidate's extension;
- ``command``: ``--run CMD`` in a worktree of the candidate;
- ``ray``: server lifetimes as Ray tasks on a cluster (``ray_ship``: what travels to a node).

Which evaluator a recipe gets is decided in one place, ``bisect_tool.run.wiring``.
"""

from bisect_tool.evaluate.base import swap_facts, untestable_stage
from bisect_tool.evaluate.command import RunCommandEvaluator
from bisect_tool.evaluate.op import OpEvaluator
from bisect_tool.evaluate.server import ControlsRunner, ServerEvaluator

__all__ = [
    "ControlsRunner",
    "OpEvaluator",
    "RunCommandEvaluator",
    "ServerEvaluator",
    "swap_facts",
    "untestable_stage",
]
