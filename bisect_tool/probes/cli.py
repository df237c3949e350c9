"""`bisect probe`: run one probe once, against a running server, an extension file, or a commit.

Exit status is the verdict: 0 CLEAN, 1 DIVERGENT, 2 INCONCLUSIVE, 3 UNTESTABLE (bad flags are
reported as usage errors by the main CLI). Only stdlib, click and (for ``--server``) httpx are
imported, so ``python -m bisect_tool.probes --extension ...`` runs on a GPU machine that has
PyTorch but not this tool's other dependencies; ``--commit`` (artifacts, runtime, git) imports
the rest only when given.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from bisect_tool.clitypes import Finite
from bisect_tool.errors import RecipeError, UsageError
from bisect_tool.interfaces import ProbeResult, ServerHandle
from bisect_tool.recipes.recipe import BUNDLED_DIR, ProbeSettings, load
from bisect_tool.values import Verdict

DEFAULT_RECIPE = "batch-invariance"
EXIT_CODES = {
    Verdict.CLEAN: 0,
    Verdict.DIVERGENT: 1,
    Verdict.INCONCLUSIVE: 2,
    Verdict.UNTESTABLE: 3,
}


def probe_settings(recipe: str, **overrides: Any) -> ProbeSettings:
    """The recipe's probe settings with CLI overrides (None = not given)."""
    try:
        settings = load(recipe).probe
    except RecipeError:
        # The bundled recipe may not be written yet; its defaults are ProbeSettings()'s.
        if recipe != DEFAULT_RECIPE or (BUNDLED_DIR / f"{DEFAULT_RECIPE}.toml").exists():
            raise
        settings = ProbeSettings()
    given = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(settings, **given) if given else settings


def parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {pair!r} must be KEY=VALUE, e.g. VLLM_BATCH_INVARIANT=1")
        env[key] = value
    return env


def _complete_recipe(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    # Imported when the shell asks: this module's top-level imports stay the light ones
    # (python -m bisect_tool.probes runs on a GPU machine, tests/test_probe_op.py).
    from bisect_tool.recipes.completion import complete_recipe

    return complete_recipe(ctx, param, incomplete)


@click.command("probe")
@click.option("--server", "server_url", metavar="URL", help="Probe a running server once.")
@click.option("--sequential", is_flag=True,
              help="With --server: one request in flight at a time (the negative control).")
@click.option("--model", default=None, help="Model name for requests (default: /v1/models).")
@click.option("--extension", type=click.Path(path_type=Path), metavar="PATH",
              help="Run the focused op check on this compiled extension (.so).")
@click.option("--also-load", "also_load", multiple=True, type=click.Path(path_type=Path),
              metavar="PATH", help="With --extension: another extension to load first (the "
              "_moe_C_stable_libtorch.abi3.so of _moe_C:: ops).")
@click.option("--python", "python", default=None, metavar="EXE",
              help="Interpreter with PyTorch for --extension (default: this one); numpy is "
              "enough when the recipe's op_abi is \"ctypes\".")
@click.option("--env", "env_pairs", multiple=True, metavar="K=V",
              help="Environment for the --extension child, e.g. VLLM_BATCH_INVARIANT=1.")
@click.option("--commit", default=None, metavar="REF",
              help="Build/fetch this commit's artifacts as the recipe says and probe lifetimes.")
@click.option("--recipe", default=DEFAULT_RECIPE, show_default=True, help="Recipe name or path.",
              shell_complete=_complete_recipe)
@click.option("--repo", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="With --commit: the target repository (your vLLM clone).")
@click.option("--lifetimes", type=click.IntRange(min=0), default=1, show_default=True,
              help="With --commit: fresh server lifetimes to probe (0 with --controls: only them).")
@click.option("--controls", is_flag=True,
              help="With --commit: also run the positive/negative controls on the commit.")
@click.option("--state-dir", type=click.Path(path_type=Path), default=None,
              help="With --commit: keep logs and builds' state here (default: a temp dir).")
@click.option("--requests", type=click.IntRange(min=1), default=None,
              help="Requests sharing the prefix (M).")
@click.option("--fillers", type=click.IntRange(min=0), default=None,
              help="Unrelated filler requests (F).")
@click.option("--repeats", type=click.IntRange(min=2), default=None,
              help="Repeats compared pairwise (R).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None)
@click.option("--jitter-ms", type=Finite(min=0), default=None,
              help="Random submission delay per request, 0..N ms.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw result as JSON.")
def probe_command(
    server_url: str | None,
    sequential: bool,
    model: str | None,
    extension: Path | None,
    also_load: tuple[Path, ...],
    python: str | None,
    env_pairs: tuple[str, ...],
    commit: str | None,
    recipe: str,
    repo: Path,
    lifetimes: int,
    controls: bool,
    state_dir: Path | None,
    requests: int | None,
    fillers: int | None,
    repeats: int | None,
    max_tokens: int | None,
    jitter_ms: float | None,
    as_json: bool,
) -> None:
    """Run one probe once (against a running server or an extension file).

    Exit status: 0 CLEAN, 1 DIVERGENT, 2 INCONCLUSIVE, 3 UNTESTABLE.
    """
    given = [name for name, v in (("--server", server_url), ("--extension", extension),
                                  ("--commit", commit)) if v is not None]
    if len(given) != 1:
        raise UsageError("give exactly one of --server URL, --extension PATH or --commit REF")
    if commit is None and (controls or lifetimes != 1 or state_dir is not None):
        raise UsageError("--controls, --lifetimes and --state-dir go with --commit REF")
    if commit is not None:
        overrides = {"requests": requests, "fillers": fillers, "repeats": repeats,
                     "max_tokens": max_tokens, "jitter_ms": jitter_ms}
        if _commit_prober is None:
            raise UsageError(
                "--commit needs the whole tool (artifacts, runtime, git): run `bisect probe "
                "--commit`, not `python -m bisect_tool.probes`"
            )
        verdict = _commit_prober(commit, recipe, repo, lifetimes, controls, state_dir,
                                 overrides, as_json)
        sys.exit(EXIT_CODES[verdict])
    settings = probe_settings(recipe, requests=requests, fillers=fillers, repeats=repeats,
                              max_tokens=max_tokens, jitter_ms=jitter_ms)
    if server_url is not None:
        result = _probe_server(server_url, settings, sequential, model)
    else:
        assert extension is not None
        result = _probe_extension(extension, settings, python, parse_env(env_pairs), also_load)
    if as_json:
        click.echo(json.dumps({"verdict": result.verdict.value, "message": result.message,
                               "detail": result.detail}, indent=2))
    else:
        from bisect_tool.probes.render import render_op_detail, render_server_detail

        render = render_op_detail if extension is not None else render_server_detail
        click.echo(render(result.detail))
        click.echo(f"\n{result.verdict.value.upper()}: {result.message}")
    sys.exit(EXIT_CODES[result.verdict])


def _probe_server(
    url: str, settings: ProbeSettings, sequential: bool, model: str | None
) -> ProbeResult:
    check_server_url(url)
    from bisect_tool.probes.batch_sizes import server_probe  # httpx only when needed

    probe = server_probe(settings, model=model, sequential=sequential)
    return probe.run(ServerHandle(url=url, lifetime_id="cli", log_path=Path(os.devnull)))


def check_server_url(url: str) -> None:
    """A usable http(s) URL with a host and a port in 1..65535, or a one-line UsageError (httpx
    would raise its own exception types for ``http://[::1`` or ``http://localhost:99999``)."""
    from urllib.parse import urlsplit

    example = "give one such as http://127.0.0.1:8000 or http://[::1]:8000"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"--server {url!r} is not a valid URL ({exc}); {example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--server {url!r} must be an http(s) URL with a host; {example}")
    if port == 0:
        raise UsageError(f"--server {url!r}: port 0 cannot be connected to; {example}")


def _probe_extension(
    path: Path, settings: ProbeSettings, python: str | None, env: dict[str, str],
    also: tuple[Path, ...] = (),
) -> ProbeResult:
    for given in (path, *also):
        if not given.is_file():
            raise UsageError(f"{given}: no such file; give the path of the .so to check")
    from bisect_tool.probes.op import OpProbe

    return OpProbe(settings, python=python).run_extension(path, env, also)


# ---- --commit: one candidate through the same stages a bisect uses -------------------------------

#: (ref, recipe, repo, lifetimes, controls, state dir, probe overrides, as_json) -> the verdict
CommitProber = Callable[[str, str, Path, int, bool, "Path | None", dict[str, Any], bool], Verdict]
_commit_prober: CommitProber | None = None


def register_commit_prober(prober: CommitProber) -> None:
    """``--commit`` goes through the run owner, which the full tool registers here
    (``bisect_tool.cli.probe``): this package never imports the stages above it, so
    ``python -m bisect_tool.probes`` runs on a GPU machine with only click and httpx."""
    global _commit_prober
    _commit_prober = prober
