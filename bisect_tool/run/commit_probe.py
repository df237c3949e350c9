"""One candidate, as a bisect evaluates it: ``bisect probe --commit REF``.

The candidate's artifacts, fresh lifetimes (and, asked, the controls) through the evaluators
the recipe describes (``bisect_tool.run.wiring``, the same a run uses), and its verdict by the
search's own rule (``bisect_tool.verdict``). No journal: a probe decides nothing.
"""

from __future__ import annotations

import secrets
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_tool.errors import UsageError
from bisect_tool.events import ControlsEnded, LifetimeEnded, LifetimeStarted, Note, Observer, ignore
from bisect_tool.kinds import find
from bisect_tool.recipes.recipe import Recipe
from bisect_tool.run.wiring import EvaluatorFactory, open_evaluators
from bisect_tool.values import Observation, Verdict, short
from bisect_tool.verdict import aggregate, trusted


@dataclass(frozen=True)
class CommitProbe:
    """``bisect probe --commit``: the candidate's verdict over its lifetimes, by the search's
    rule (``verdict.aggregate``), vetoed to INCONCLUSIVE when the controls failed."""

    sha: str
    verdict: Verdict
    note: str
    observations: tuple[Observation, ...]
    controls: dict[str, Any] | None


def probe_commit(
    repo_path: Path,
    ref: str,
    recipe: Recipe,
    *,
    lifetimes: int,
    controls: bool,
    state_dir: Path | None,
    observer: Observer = ignore,
    evaluator_factory: EvaluatorFactory = open_evaluators,
) -> CommitProbe:
    from bisect_tool.range import open_repo, resolve_ref
    from bisect_tool.runtime.common import sigterm_raises

    if lifetimes == 0 and not controls:
        raise UsageError("--lifetimes 0 probes nothing; give --lifetimes 1 or more, or --controls")
    kind = find(recipe.probe.kind)
    if controls and not kind.has_controls:
        raise UsageError(f"--controls needs a server probe; the {kind.name} probe has no controls")
    git_repo = open_repo(repo_path)
    sha = resolve_ref(git_repo, ref)
    # Release tags let the download provider find the commit's published wheel.
    tags = {sha: tuple(t for t in git_repo.git.tag("--points-at", sha).split() if t)}
    session_id = f"probe-{secrets.token_hex(4)}"
    observer(Note(
        f"probing {short(sha)} ({ref}) with recipe {recipe.name!r}, session {session_id}"
    ))
    observations: list[Observation] = []
    control_entry: dict[str, Any] | None = None
    with _scratch(state_dir) as state, sigterm_raises(), evaluator_factory(
        recipe, repo_path.resolve(), session_id, state, tags, observer
    ) as evaluators:
        evaluator = evaluators.faithful
        if controls:
            runner = evaluators.controls_for(sha)
            assert runner is not None  # a server probe always has a controls runner
            observer(Note("running the controls (invariance off: concurrent, then sequential)"))
            control_entry = dict(runner.run())
            observer(ControlsEnded(bool(control_entry["ok"]), control_entry))
        for index in range(lifetimes):
            lifetime_id = f"{short(sha)}-probe-{index}"
            observer(LifetimeStarted(sha, lifetime_id))
            started = time.monotonic()
            obs = evaluator.evaluate(sha, lifetime_id, tags[sha])
            observations.append(obs)
            observer(
                LifetimeEnded(
                    sha,
                    lifetime_id,
                    str(obs.verdict),
                    obs.message,
                    obs.duration_s or time.monotonic() - started,
                    obs.detail,
                )
            )
    controls_ok = None if control_entry is None else bool(control_entry["ok"])
    if observations:
        verdict, note = trusted(aggregate(o.verdict for o in observations), controls_ok)
    else:
        verdict, note = (Verdict.CLEAN if controls_ok else Verdict.INCONCLUSIVE), ""
    return CommitProbe(sha, verdict, note, tuple(observations), control_entry)


@contextmanager
def _scratch(state_dir: Path | None) -> Iterator[Path]:
    if state_dir is not None:
        state_dir.mkdir(parents=True, exist_ok=True)
        yield state_dir
    else:
        with tempfile.TemporaryDirectory(prefix="bisect-probe-") as tmp:
            yield Path(tmp)
