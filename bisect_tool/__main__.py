"""``python -m bisect_tool`` and the ``bisect`` console script.

The CLI's imports take ~0.4 s (click, gitpython, numpy...). A Ctrl-C in that time must end like
any later one, one line and exit 130, not a KeyboardInterrupt traceback (issue 30); nothing has
been written yet then. It is held while they run and acted on when they are done: raised there,
a KeyboardInterrupt can land in one of the import system's own callbacks, where Python prints
it and goes on ("Exception ignored in ... _get_module_lock"), and the Ctrl-C would be lost.
"""

import signal
import sys
from typing import Any


def main() -> None:
    pressed: list[int] = []
    # only Python's own Ctrl-C handling is held back (an ignored SIGINT stays ignored)
    hold = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if hold:
        signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    handler: Any = signal.default_int_handler
    try:
        from bisect_tool import interrupts

        # from here on a Ctrl-C that lands in a finalizer (Popen.__del__ after every `git`
        # command) is delivered again, not dropped
        interrupts.install()
        handler = interrupts.on_sigint
        from bisect_tool.cli import main as cli_main
    except KeyboardInterrupt:
        pressed.append(signal.SIGINT)
    finally:
        if hold:
            signal.signal(signal.SIGINT, handler)
    if pressed:
        sys.stderr.write("bisect: interrupted before it started; nothing was written\n")
        sys.exit(130)
    cli_main()


if __name__ == "__main__":
    main()
