"""The `bisect` command line. Errors are caught once here: one line, an exit code, no traceback.

One module per command group: ``start`` (start, plan, resume), ``locate``, ``show`` (status,
log, replay, report), ``manual`` (good, bad, skip), ``reset``, ``probe`` (``probe --commit``);
what they share (the state dir, its options and lock, progress, the outcome) is ``common``.
The stages' own groups live beside them: ``bisect_tool.artifacts.cli``,
``bisect_tool.probes.cli``, ``bisect_tool.runtime.cli``, ``bisect_tool.demo.cli``,
``bisect_tool.cli.simulate``.
"""

from __future__ import annotations

import errno
import sys

import click

from bisect_tool import __version__
from bisect_tool.artifacts.cli import artifacts_group
from bisect_tool.cli.locate import locate
from bisect_tool.cli.manual import judge_commands
from bisect_tool.cli.probe import probe_commit
from bisect_tool.cli.reset import reset
from bisect_tool.cli.show import log, replay_cmd, report, status
from bisect_tool.cli.simulate import simulate_command
from bisect_tool.cli.start import plan_command, resume, start
from bisect_tool.demo.cli import demo_command
from bisect_tool.errors import BisectError, InfrastructureError, exit_code_table
from bisect_tool.probes.cli import probe_command, register_commit_prober
from bisect_tool.runtime.cli import model_group


def _exit_codes_epilog() -> str:
    # \b keeps click from rewrapping the table (generated from errors.py: it cannot drift).
    return "\b\nExit codes:\n" + exit_code_table(markdown=False)


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=_exit_codes_epilog(),
)
@click.version_option(__version__, prog_name="bisect")
def cli() -> None:
    """Find the vLLM commit that introduced or fixed an intermittent bug in compiled kernels."""


for _command in (
    start, plan_command(), resume, locate, status, log, replay_cmd, report, *judge_commands,
    reset, artifacts_group, probe_command, demo_command, model_group, simulate_command,
):
    cli.add_command(_command)
register_commit_prober(probe_commit)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="bisect", standalone_mode=False)
    except BisectError as exc:
        click.echo(f"bisect: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("bisect: interrupted; `bisect resume` continues where it stopped", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        # One line, like every other error: the bad flag and its allowed range.
        hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        click.echo(f"bisect: {exc.format_message()}{hint}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("bisect: interrupted; `bisect resume` continues where it stopped", err=True)
        sys.exit(130)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # A full disk wherever no step names it itself: one line, never a traceback (issue 38)
        where = f" writing {exc.filename}" if exc.filename else ""
        click.echo(f"bisect: no space left on the disk{where} ({exc.strerror}); free space "
                   "there, then `bisect resume`", err=True)
        sys.exit(InfrastructureError.exit_code)
