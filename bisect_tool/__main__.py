"""``python -m bisect_tool`` and the ``bisect`` console script.

The CLI's imports take ~0.4 s (click, gitpython, numpy...). A Ctrl-C in that time must end like
any later one, one line and exit 130, not a KeyboardInterrupt traceback (issue 30); nothing has
been written yet then.
"""

import sys


def main() -> None:
    try:
        from bisect_tool.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("bisect: interrupted before it started; nothing was written\n")
        sys.exit(130)
    cli_main()


if __name__ == "__main__":
    main()
