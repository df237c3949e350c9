"""Which tier of the suite this session runs, for tests that scale their work to it.

``make check`` (``-m "not slow ..."``) is the fast tier a developer runs while changing code:
there the property tests draw fewer examples. ``make test`` (everything, as CI runs it) and any
run that does not deselect ``slow`` draw the full count. ``conftest.pytest_configure`` sets
``FAST`` before any test module is imported.
"""

from __future__ import annotations

FAST = False


def examples(full: int, fast: int) -> int:
    """``max_examples`` for a property test: ``full`` under ``make test``, ``fast`` under
    ``make check``."""
    return fast if FAST else full
