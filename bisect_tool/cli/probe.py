"""`bisect probe --commit REF`: one candidate through the same stages a bisect uses.

The ``probe`` command lives in ``bisect_tool.probes`` (light: it runs on a GPU machine with
only click and httpx); its ``--commit`` needs the run owner, so the full CLI registers this
module's ``probe_commit`` there (``probes.cli.register_commit_prober``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from bisect_tool.values import Verdict


def probe_commit(
    ref: str,
    recipe_name: str,
    repo_path: Path,
    lifetimes: int,
    controls: bool,
    state_dir: Path | None,
    overrides: dict[str, Any],
    as_json: bool,
) -> Verdict:
    """Probe ``lifetimes`` fresh lifetimes of one commit (and, with ``controls``, the controls)
    through the run owner, exactly as a bisect would evaluate that candidate."""
    # Imported here: --server/--extension must work without git, docker and the artifacts stage.
    from bisect_tool.recipes import recipe as recipe_mod
    from bisect_tool.run.commit_probe import probe_commit as probe

    recipe = recipe_mod.load(recipe_name).override("probe", **overrides)

    def observer(event: Any) -> None:
        from bisect_tool.events import ControlsEnded, LifetimeEnded, LifetimeStarted, Note

        if isinstance(event, Note):
            click.echo(event.text, err=True)
        elif isinstance(event, LifetimeStarted):
            click.echo(f"lifetime {event.lifetime_id}", err=True)
        elif isinstance(event, LifetimeEnded) and not as_json:
            _echo_lifetime(event)
        elif isinstance(event, ControlsEnded) and not as_json:
            _echo_controls(event.entry)

    probed = probe(
        repo_path, ref, recipe, lifetimes=lifetimes, controls=controls, state_dir=state_dir,
        observer=observer,
    )
    observations, note, verdict = probed.observations, probed.note, probed.verdict
    sha = probed.sha
    if as_json:
        click.echo(json.dumps({
            "commit": sha,
            "ref": ref,
            "verdict": verdict.value,
            "note": note,
            "lifetimes": [
                {"lifetime_id": o.lifetime_id, "verdict": o.verdict.value, "message": o.message,
                 "duration_s": round(o.duration_s, 3), "detail": o.detail}
                for o in observations
            ],
            "controls": probed.controls,
        }, indent=2, default=str))
    else:
        counts = ", ".join(
            f"{sum(o.verdict is v for o in observations)} {v.value}"
            for v in Verdict if any(o.verdict is v for o in observations)
        )
        n = len(observations)
        summary = f"{n} lifetime{'s' if n != 1 else ''}: {counts}" if n else "controls only"
        click.echo(f"\n{verdict.value.upper()}: {sha[:12]} ({ref}): {summary}"
                   + (f"; {note}" if note else ""))
    return verdict


def _echo_lifetime(obs: Any) -> None:
    """One ended lifetime (a ``LifetimeEnded`` event): its verdict line and its table."""
    from bisect_tool.probes.render import render_detail

    click.echo(f"\n== lifetime {obs.lifetime_id}: {obs.verdict.upper()}: {obs.message}")
    if obs.detail and obs.verdict != Verdict.UNTESTABLE:
        click.echo(render_detail(obs.detail))


def _echo_controls(entry: dict[str, Any]) -> None:
    from bisect_tool.probes.render import render_server_detail

    for name, want in (("positive", "divergent"), ("negative", "clean")):
        part = entry.get(name) or {}
        got = str(part.get("verdict", "?"))
        held = "held" if got == want else "FAILED"
        click.echo(f"\n== {name} control (must be {want}): {got.upper()} ({held}): "
                   f"{part.get('message', '')}")
        if part.get("detail"):
            click.echo(render_server_detail(part["detail"]))
    for row in (entry.get("suspects") or {}).get("settings") or []:
        click.echo(f"\n== suspect {row['setting']} (batch invariance as the recipe has it): "
                   f"divergent in {row['divergent']} of {row['conclusive']} conclusive "
                   f"lifetimes ({', '.join(row['verdicts'])})")
    for finding in (entry.get("suspects") or {}).get("findings") or []:
        click.echo(f"suspects: {finding}")
    click.echo(f"\ncontrols: {'ok' if entry.get('ok') else entry.get('problem')}")
