"""The `bisect` command line. Errors are caught once here: one line, an exit code, no traceback."""

from __future__ import annotations

import sys

import click

from bisect_tool import __version__
from bisect_tool.artifacts.cli import artifacts_group
from bisect_tool.demo.cli import demo_command
from bisect_tool.errors import BisectError
from bisect_tool.probes.cli import probe_command
from bisect_tool.runtime.cli import model_group


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bisect")
def cli() -> None:
    """Find the vLLM commit that introduced or fixed an intermittent bug in compiled kernels."""


cli.add_command(artifacts_group)
cli.add_command(probe_command)
cli.add_command(demo_command)
cli.add_command(model_group)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="bisect", standalone_mode=False)
    except BisectError as exc:
        click.echo(f"bisect: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("bisect: interrupted; `bisect resume` continues where it stopped", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("bisect: interrupted; `bisect resume` continues where it stopped", err=True)
        sys.exit(130)
