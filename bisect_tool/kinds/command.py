"""``bisect start --run CMD``: a command's exit status, like ``git bisect run``
(``bisect_tool.evaluate.command``). Not a ``[probe] kind`` (``KINDS`` does not list it): the
report names what a ``--run`` session evaluated with it."""

from __future__ import annotations

from bisect_tool.kinds.spec import ProbeSpec

SPEC = ProbeSpec(name="run", detail_columns=False)
