"""What the tool knows of one probe kind, as one frozen value.

Every stage outside ``bisect_tool/probes/`` that behaves differently by probe kind reads a field
of the kind's ``ProbeSpec`` instead of comparing the kind's name (``tests/test_architecture.py``
holds it so). The specs import nothing of the tool: recipe validation, the report and the
lookahead all read them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: the heading of a server probe's size column (the most the logprobs moved)
LOGPROB_HEAD = "Max \\|Δ logprob\\| up to the first differing token"

#: a question about a recipe's ``[probe]`` table (``Recipe.to_dict()["probe"]``)
ProbeQuestion = Callable[[Mapping[str, Any]], bool]


def never(probe: Mapping[str, Any]) -> bool:
    """The answer of a kind that does not depend on its ``[probe]`` table: no."""
    return False


@dataclass(frozen=True)
class ProbeSpec:
    """One probe kind (``[probe] kind``), as the run, the plan, preflight, the lookahead and the
    report see it."""

    name: str
    #: each run boots a server of its own (a *lifetime*): ``gpus_per_lifetime`` makes it tensor
    #: parallel, ``lifetimes_per_gpu = "auto"`` sizes it from the cards, lifetimes share the
    #: GPU slots, the compatibility gate is asked of the pinned stack, the report tabulates
    #: each lifetime's co-residency and repeats and says how to reproduce one by hand
    boots_server: bool = False
    #: it has positive and negative controls (``[probe] controls``, ``bisect probe --controls``)
    has_controls: bool = False
    #: it runs fixed inputs: a candidate gives the same answer every run (``bisect plan``
    #: assumes p = 1, q = 0)
    deterministic: bool = False
    #: it may be a recipe's fast stand-in (``[probe] narrow``, the tiered search's narrow tier)
    narrows: bool = False
    #: the pinned interpreter runs it on this machine with the local backend (preflight)
    local_interpreter: bool = False
    #: it needs torch and a GPU under the pinned interpreter, given the ``[probe]`` table
    #: (preflight); a booted server's need is its server module's, not the kind's
    needs_torch: ProbeQuestion = field(default=never)
    #: it runs on this machine's CPUs, given the ``[probe]`` table (the lookahead: a source
    #: build then competes with it, so nothing is built ahead)
    on_cpu: ProbeQuestion = field(default=never)
    #: what the report calls one of its runs
    noun: str = "run"
    #: the report's evidence tables give each run's co-residency, outputs and sizes (a
    #: command's exit status has none of them: three columns)
    detail_columns: bool = True
    #: the heading of the evidence table's size column
    size_head: str = LOGPROB_HEAD
    #: the ``[probe]`` keys the report's recipe summary lists
    recipe_keys: tuple[str, ...] = ()
