"""Probe kinds: one ``ProbeSpec`` per ``[probe] kind``, in a module of its own here, and one
line in ``KINDS``.

What every other stage decides by probe kind (recipe validation's choices, preflight, the
lookahead, ``bisect plan``, the report's columns and labels) it reads from the kind's spec,
never by comparing the kind's name (``tests/test_architecture.py``). The probe itself lives in
``bisect_tool/probes/`` and its evaluators' factory in ``bisect_tool.run.wiring.PROBES`` (held to
``KINDS`` by ``tests/test_architecture.py``); the specs live here, apart from the probes,
because recipe validation reads them and the probes import the recipe.
"""

from __future__ import annotations

from bisect_tool.kinds import command, op, server
from bisect_tool.kinds.spec import ProbeSpec

#: every ``[probe] kind`` a recipe may name, by name
KINDS: dict[str, ProbeSpec] = {spec.name: spec for spec in (
    server.SPEC,
    op.SPEC,
)}
#: the kind of a recipe that names none
DEFAULT = server.SPEC.name
#: what a ``--run`` session evaluates with (not a ``[probe] kind``)
COMMAND = command.SPEC

__all__ = ["COMMAND", "DEFAULT", "KINDS", "ProbeSpec", "find", "kind_choices", "narrow_choices",
           "narrowing"]


def kind_choices() -> tuple[str, ...]:
    """What ``[probe] kind`` may be."""
    return tuple(KINDS)


def narrow_choices() -> tuple[str, ...]:
    """What ``[probe] narrow`` may be ("": no fast stand-in)."""
    return ("", *(name for name, spec in KINDS.items() if spec.narrows))


def narrowing(name: str | None) -> ProbeSpec:
    """The spec of a recipe's fast stand-in (``[probe] narrow``; none named: the first kind that
    may narrow)."""
    spec = KINDS.get(name or "")
    if spec is not None and spec.narrows:
        return spec
    return next(s for s in KINDS.values() if s.narrows)


def find(name: str | None) -> ProbeSpec:
    """The spec of a ``[probe] kind`` (none given: ``DEFAULT``'s) or of ``COMMAND`` (a report's
    ``probe_kind`` for a ``--run`` session); for a name no kind has (a journal edited by hand,
    a recipe built in code and refused later by ``bisect_tool.run.wiring``), one of defaults: it
    boots no server, has no controls, narrows nothing."""
    if name == COMMAND.name:
        return COMMAND
    return KINDS.get(name or DEFAULT) or ProbeSpec(name=str(name))
