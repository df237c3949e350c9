"""Manual mode, `bisect good|bad|skip`: a verdict given by hand, and the next candidate to
judge, decided by the same rules as an unattended run (``bisect_tool.designs.phases``). Pure."""

from __future__ import annotations

from bisect_tool.designs.ledger import Ledger, observation_entry
from bisect_tool.designs.phases import stop_reason, suspect
from bisect_tool.journal import entries
from bisect_tool.range import Candidate
from bisect_tool.strategy import NoCandidateLeft
from bisect_tool.values import Observation, Verdict, short
from bisect_tool.verdict import EndState


def manual_entry(
    state: Ledger, commit: str, verdict: Verdict, message: str = "manual"
) -> entries.ObservationEntry:
    """The observation entry of one verdict given by hand."""
    position = next((i for i, c in enumerate(state.candidates) if c.sha == commit), None)
    if position is None:
        from bisect_tool.errors import UsageError

        raise UsageError(f"{short(commit)} is not a candidate of this bisect; see `bisect log`")
    obs = Observation(
        commit, verdict, state.next_lifetime_ids(commit)[0], {"manual": True}, message
    )
    return observation_entry(obs, position)


def next_manual_candidate(state: Ledger) -> Candidate | None:
    reason = stop_reason(state)
    # a quiet bad end is asked again (a bug that shows only sometimes), unless the probe is
    # deterministic: then its one clean answer ends the run
    again = reason is not None and reason[0] is EndState.BAD_END_NEVER \
        and not state.strategy.summary().deterministic
    if reason is not None and not again:
        return None
    wanted = suspect(state)  # the same checks as an unattended run's
    if wanted is not None:
        return state.candidates[wanted[0]]
    try:
        return state.candidates[state.strategy.select().position]
    except NoCandidateLeft:
        return None


def why_again(state: Ledger, candidate: Candidate) -> str | None:
    """Why a commit already judged is asked again, where a check of the model asks it (issue
    38: the good end and the commit next to the flip must keep running clean before a commit
    is named): a user judging by hand sees the reason, and the way out when a verdict by hand
    is final."""
    wanted = suspect(state)
    if wanted is None or state.candidates[wanted[0]].sha != candidate.sha:
        return None
    return (f"again: {wanted[1]} (a bug that shows only sometimes); if one verdict by hand is "
            "final, start with --deterministic")
