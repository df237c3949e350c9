"""How every entry point of the command line reports a failure: one line, ``bisect: <what>``,
and the failure's own exit code (``bisect_tool.errors``), never a traceback; click's own errors
as click shows them. Imports click, the standard library and ``errors`` only (``python -m
bisect_tool.probes`` uses it on a GPU machine)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import click

from bisect_tool.errors import BisectError


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Around a command's ``main(standalone_mode=False)``: a ``BisectError`` is its message on
    stderr and its exit code; a click error is shown and exits with click's code."""
    try:
        yield
    except BisectError as exc:
        click.echo(f"bisect: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
