"""``python -m bisect_tool.probes``: `bisect probe` without the other stages' imports.

The GPU machine has PyTorch but not gitpython/docker/tenacity, which the full CLI's other
commands import; this entry point needs only click (and httpx for --server).
"""

from __future__ import annotations

import sys

import click

from bisect_tool.errors import BisectError
from bisect_tool.probes.cli import probe_command


def main(argv: list[str] | None = None) -> None:
    try:
        probe_command.main(args=argv, prog_name="bisect probe", standalone_mode=False)
    except BisectError as exc:
        click.echo(f"bisect: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
