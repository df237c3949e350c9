"""``python -m bisect_tool.probes``: `bisect probe` without the other stages' imports.

The GPU machine has PyTorch but not gitpython/docker/tenacity, which the full CLI's other
commands import; this entry point needs only click (and httpx for --server).
"""

from __future__ import annotations

from bisect_tool.clierrors import one_line_errors
from bisect_tool.probes.cli import probe_command


def main(argv: list[str] | None = None) -> None:
    with one_line_errors():
        probe_command.main(args=argv, prog_name="bisect probe", standalone_mode=False)


if __name__ == "__main__":
    main()
