"""One error root for the whole tool.

Every failure a user can cause or meet is a ``BisectError`` with an exit code; the CLI catches
the root once and prints one line (``bisect: <message>``), never a traceback. Messages name the fix.

Each kind of failure has its own exit code, so a script can tell them apart without parsing the
message: the table (``exit_code_table``) is generated from the classes below, and both
``bisect --help`` and the README print it (tests/test_inputs.py checks the README against it).
"""

from __future__ import annotations


class BisectError(Exception):
    """Root of every error the CLI turns into a one-line message and a non-zero exit."""

    exit_code = 1
    #: what the exit code means, in the table of ``bisect --help`` and the README
    meaning = "an error with no code of its own"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(BisectError):
    """Bad flags or arguments."""

    exit_code = 2
    meaning = "bad flags or arguments (a number out of range, a path that cannot be used)"


class RangeError(BisectError):
    """The good/bad range cannot be resolved (unknown ref, not an ancestor, empty range...)."""

    exit_code = 3
    meaning = "the range cannot be resolved (unknown ref or release, not a git clone)"


class RecipeError(BisectError):
    """A recipe file is malformed (unknown key, wrong type, missing field)."""

    exit_code = 4
    meaning = "the recipe is malformed (unknown key, wrong type, value out of range)"


class StateError(BisectError):
    """The state dir is taken: another bisect holds its lock, or one is in progress there.

    The root of every state-dir failure; the subclasses below have codes of their own."""

    exit_code = 5
    meaning = "the state dir is busy: another bisect holds its lock, or one is in progress there"


class LockHeld(StateError):
    """Another live process holds the state dir's lock (statelock.py)."""

    exit_code = 5
    meaning = StateError.meaning


class JournalLost(StateError):
    """The journal file this run writes was deleted or replaced while it ran: stop at once
    rather than go on recording nothing (and end with exit 0). Its own code: no other failure
    means that the record of a run is gone."""

    exit_code = 16
    meaning = "the journal was deleted or replaced while the run wrote it (what it held is saved)"


class AbortError(BisectError):
    """The run must stop (probe killed by a signal, probe timeout, user interrupt)."""

    exit_code = 6
    meaning = "the run was stopped: SIGTERM or SIGHUP, a probe killed by a signal, --run-timeout"


class Interrupted(AbortError):
    """SIGTERM (Ctrl-C is click's Abort): stopped on request, not failed; the journal stays for
    `bisect resume`, even when nothing was observed yet."""

    #: the signal that raised it, when one did (``runtime.common.sigterm_raises``)
    signum: int | None = None


class UntestableError(BisectError):
    """The candidate cannot be evaluated: no artifact, build or boot failure, ABI mismatch.

    Never a verdict about the bug: the search removes the candidate instead of counting it bad.
    """

    exit_code = 7
    meaning = "a candidate could not be evaluated (no artifact, build or boot failure)"


class ArtifactUnavailable(UntestableError):
    """No source could provide the candidate's compiled files."""


class BuildFailed(UntestableError):
    """A source build of the candidate failed; the message carries the build log's tail."""


class IncompatibleExtension(UntestableError):
    """The candidate's extension registers ops whose schemas differ from the pinned stack's."""


class BootFailed(UntestableError):
    """The candidate's server died or never became healthy; the message carries the log tail."""


class InfrastructureError(BisectError):
    """Something outside the candidate failed (Docker engine, cluster, disk). Never a verdict."""

    exit_code = 8
    meaning = "infrastructure failed (Docker engine, Ray cluster, disk)"


class NoAnswer(BisectError):
    """The search stopped without an answer (bad end never reproduced, budget exhausted, an end
    untestable, controls failed). Not a crash: the journal and `bisect report` say why."""

    exit_code = 9
    meaning = "the search stopped without an answer; `bisect report` says why"


class NoSession(StateError):
    """No journal in the state dir: nothing to resume, show or judge."""

    exit_code = 10
    meaning = "no bisect session in the state dir (start one with `bisect start`)"


class StateDirUnusable(StateError):
    """The state dir cannot be created, written or locked (a file, no permission)."""

    exit_code = 11
    meaning = "the state dir cannot be created, written or locked"


class CorruptJournal(StateError):
    """The journal cannot be read: not UTF-8, not JSON, not an entry this tool wrote, another
    version, or at odds with its own header."""

    exit_code = 12
    meaning = "the journal is unreadable or corrupt (the message names the line)"


class ResetRefused(StateError):
    """``bisect reset`` was pointed at something it cannot prove is its own state dir (a folder
    with other files, a git work tree, a file): it deletes nothing."""

    exit_code = 13
    meaning = "`bisect reset` refused: the folder holds files bisect did not write; nothing deleted"


#: Exit codes that are no error class: the answer, and the interrupt.
_OUTCOMES = (
    (0, "an answer (start/resume/locate/demo), or the command did what it was asked"),
    (130, "interrupted (Ctrl-C); `bisect resume` continues"),
)


def _classes() -> list[type[BisectError]]:
    found: list[type[BisectError]] = []
    todo: list[type[BisectError]] = [BisectError]
    while todo:
        cls = todo.pop(0)
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def exit_codes() -> list[tuple[int, str, str]]:
    """(code, error class names, meaning) for every exit status of ``bisect``, by code. A class
    that shares its parent's code (``BuildFailed`` under ``UntestableError``) is not listed."""
    by_code: dict[int, tuple[list[str], str]] = {}
    for cls in _classes():
        if cls.exit_code in by_code and "meaning" not in vars(cls):
            continue
        names, meaning = by_code.setdefault(cls.exit_code, ([], cls.meaning))
        names.append(cls.__name__)
    rows = [(code, ", ".join(names), meaning) for code, (names, meaning) in by_code.items()]
    rows += [(code, "", meaning) for code, meaning in _OUTCOMES]
    return sorted(rows)


def exit_code_table(markdown: bool = True) -> str:
    """The exit codes as a Markdown table (the README), or as aligned lines (``--help``)."""
    rows = exit_codes()
    if not markdown:
        return "\n".join(f"{code:>3}  {meaning}" for code, _names, meaning in rows)
    lines = ["| exit | meaning |", "|---:|---|"]
    lines += [f"| {code} | {meaning} |" for code, _names, meaning in rows]
    return "\n".join(lines)
