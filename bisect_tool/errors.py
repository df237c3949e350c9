"""One error root for the whole tool.

Every failure a user can cause or meet is a ``BisectError`` with an exit code; the CLI catches
the root once and prints one line (``bisect: <message>``), never a traceback. Messages name the fix.
"""

from __future__ import annotations


class BisectError(Exception):
    """Root of every error the CLI turns into a one-line message and a non-zero exit."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(BisectError):
    """Bad flags or arguments."""

    exit_code = 2


class RangeError(BisectError):
    """The good/bad range cannot be resolved (unknown ref, not an ancestor, empty range...)."""

    exit_code = 3


class RecipeError(BisectError):
    """A recipe file is malformed (unknown key, wrong type, missing field)."""

    exit_code = 4


class StateError(BisectError):
    """No session, a session already running, or a journal that cannot be read."""

    exit_code = 5


class AbortError(BisectError):
    """The run must stop (probe killed by a signal, probe timeout, user interrupt)."""

    exit_code = 6


class Interrupted(AbortError):
    """SIGTERM (Ctrl-C is click's Abort): stopped on request, not failed; the journal stays for
    `bisect resume`, even when nothing was observed yet."""


class UntestableError(BisectError):
    """The candidate cannot be evaluated: no artifact, build or boot failure, ABI mismatch.

    Never a verdict about the bug: the search removes the candidate instead of counting it bad.
    """

    exit_code = 7


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


class NoAnswer(BisectError):
    """The search stopped without an answer (bad end never reproduced, budget exhausted, an end
    untestable, controls failed). Not a crash: the journal and `bisect report` say why."""

    exit_code = 9
