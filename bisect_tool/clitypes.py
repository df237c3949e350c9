"""Number types for the command line that refuse what no setting means: NaN and infinity.

click's ``FloatRange`` lets ``nan`` through every bound (each comparison with NaN is false) and
``inf`` through every lower one; either then reaches the journal, whose JSON has no NaN
(``--confidence nan`` and ``--run-timeout inf`` ended in a traceback). ``Finite`` is
``FloatRange`` that also refuses both, with click's own one-line usage error. Imports click and
the standard library only (``python -m bisect_tool.probes`` uses it on a GPU machine).
"""

from __future__ import annotations

import math
from typing import Any

import click


class Finite(click.FloatRange):
    """A finite float, optionally within click's bounds (``Finite(min=0)``, ...)."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if isinstance(number, float) and not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number
