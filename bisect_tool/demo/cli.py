"""`bisect demo`: the whole pipeline on the built-in demo target, for real, with no GPU.

Generates the demo repository (a vLLM-shaped history with one planted fix), then runs
``bisect start --good v0.27.0 --bad v0.26.0`` with source builds of each candidate's C
extension, the extension swapped into the pinned demollm stack, several server lifetimes per
candidate and the server determinism probe; writes the report and prints a summary (or
``--json``). Everything it made stays in one folder (``bisect_tool.demo.outdir``).

``--backend docker`` runs every lifetime in a container of ``bisect-demo-stack:<digest>``, an image
derived once from the offline ``bisect-base:bookworm`` with the pinned stack inside
(``bisect_tool.demo.image``); candidates are still built on the host.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bisect_tool.errors import NoAnswer, UsageError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from bisect_tool.demo.history import DemoHistory
    from bisect_tool.journal.entries import Observed


@click.command("demo")
@click.option(
    "--workdir",
    type=click.Path(path_type=Path),
    default=None,
    help="Keep the generated repository, cache and state here (default: the --out folder).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of the report.")
@click.option(
    "--backend",
    type=click.Choice(["local", "docker"]),
    default="local",
    show_default=True,
    help="Where lifetimes run: processes here, or containers of a demo image derived from "
    "bisect-base:bookworm (make docker-up makes it).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Write report.md and posterior.png here, and without --workdir the history, its "
    "state and the cache too (default: ./bisect-demo-out, or WORKDIR/bisect-demo-out with "
    "--workdir); kept after the run.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the history.")
@click.option("--commits", type=int, default=300, show_default=True)
@click.option(
    "--lifetimes-only", is_flag=True,
    help="Search with server lifetimes alone (no op check narrowing the range first).",
)
def demo_command(
    workdir: Path | None, as_json: bool, backend: str, out: Path | None, seed: int, commits: int,
    lifetimes_only: bool,
) -> None:
    """Run the whole pipeline on the built-in demo target (no GPU needed)."""
    from bisect_tool.demo.summary import DEFAULT_OUT_DIR

    if workdir is None:  # kept, so that status, log and report find the session afterwards
        workdir = out = out or DEFAULT_OUT_DIR
    found = _run(workdir, as_json, backend, seed, commits, out or workdir / DEFAULT_OUT_DIR,
                 lifetimes_only)
    if not found:
        # A demo that did not find its own planted fix failed: `make demo` must say so.
        raise NoAnswer("the demo did not find its planted fix; the report says what it saw")


def _run(
    workdir: Path, as_json: bool, backend: str, seed: int, commits: int, out: Path,
    lifetimes_only: bool = False,
) -> bool:
    from bisect_tool.demo import outdir, pinned
    from bisect_tool.demo.history import generate

    started = time.monotonic()
    workdir = workdir.absolute()  # the history's generator runs git elsewhere
    outdir.claim(workdir)  # an earlier demo's history, state and cache here go
    repo = workdir / outdir.REPO
    history = generate(repo, seed=seed, commits=commits)
    click.echo(
        f"generated {repo} ({commits} commits); planted fix {history.planted_commit[:12]}", err=True
    )
    pinned.ensure_pinned_build()
    image = _demo_image() if backend == "docker" else ""
    from bisect_tool.demo.wheels import demo_host

    # vLLM's per-commit wheel index for the history, on loopback (main's commits, in the CUDA
    # variants its pipeline built): each candidate's swap set comes from there, by HTTP range,
    # or from a source build where the index has none
    host = demo_host(history, workdir / outdir.WHEELS)
    with host:
        return _bisect(history, workdir, as_json, seed, commits, out, lifetimes_only, image,
                       host.url, started)


def _bisect(history: DemoHistory, workdir: Path, as_json: bool, seed: int, commits: int,
            out: Path, lifetimes_only: bool, image: str, wheel_index: str,
            started: float) -> bool:
    from bisect_tool import journal as journal_mod
    from bisect_tool.demo import outdir
    from bisect_tool.run.statedir import STATE_SUBDIR
    from bisect_tool.strategy.tiers import Tier
    from bisect_tool.values import Verdict

    repo = history.repo
    # the recipe on disk is the one to bisect the history by hand (source builds: the wheel
    # index lives only as long as this demo); the run also reads the index
    recipe_path = write_recipe(workdir / outdir.RECIPE, workdir / outdir.CACHE, image=image)
    with_index = write_recipe(workdir / outdir.CACHE / "demo-recipe.run.toml",
                              workdir / outdir.CACHE, image=image, wheel_index=wheel_index)
    # where `bisect status`, `log` and `report` look when run inside the clone
    state_dir = repo / ".git" / STATE_SUBDIR
    from bisect_tool.recipes import recipe as recipe_mod
    from bisect_tool.run import owner as run
    from bisect_tool.run.progress import watching
    from bisect_tool.run.request import StartRequest

    recipe = recipe_mod.load(str(with_index))
    if lifetimes_only:
        recipe = recipe.override("probe", narrow="")
    request = StartRequest(
        repo=repo,
        good=history.good_tag,
        bad=history.bad_tag,
        journal_path=state_dir / journal_mod.JOURNAL_NAME,
        recipe=recipe,
        # as a maintainer types it inside the clone (the state dir is its .git/bisect-tool)
        command=(
            "bisect", "start", "--good", history.good_tag, "--bad", history.bad_tag,
            "--recipe", f"../{outdir.RECIPE}", *(("--no-narrow",) if lifetimes_only else ()),
        ),
    )
    # a live line on a terminal, plain lines in a log (as `bisect start` shows its progress)
    with watching(quiet=False, verbose=False) as observer:
        outcome = run.start(request, observer)
    if not outcome.answered:  # the report below says what was seen
        click.echo(f"bisect: stopped without an answer ({outcome.state}): {outcome.message}",
                   err=True)
    wall = time.monotonic() - started
    journal_path = state_dir / journal_mod.JOURNAL_NAME
    contents = journal_mod.read(journal_path)
    end = contents.end or {}
    summary = end.get("summary", {})
    narrow_runs = [o for o in contents.observed if o.tier is Tier.NARROW]
    observations = [o for o in contents.observed if o.tier is not Tier.NARROW]
    breakdown = _breakdown(observations, wall)
    report_path, plot_path, _ = _write_report(journal_path, out)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "repo": str(repo),
                    "flip_commit": summary.get("flip_commit"),
                    "planted_commit": history.planted_commit,
                    "confidence": summary.get("confidence"),
                    "p_estimate": summary.get("p_estimate"),
                    "p_interval": summary.get("p_interval"),
                    "report": str(report_path),
                    "state_dir": str(state_dir.absolute()),
                    "recipe": str(recipe_path.absolute()),
                    "plot": str(plot_path) if plot_path else None,
                    "evaluations": len({o.commit for o in observations}),
                    "lifetimes": len(observations),
                    "narrow_runs": len(narrow_runs),
                    "narrow_candidates": len({o.commit for o in narrow_runs}),
                    "wall_s": round(wall, 2),
                    "state": end.get("state"),
                    "breakdown": breakdown,
                },
                indent=2,
            )
        )
        return summary.get("flip_commit") == history.planted_commit
    # The report is a file (its path is in the summary), not 175 lines scrolling the summary
    # away; the summary comes last.
    found = summary.get("flip_commit") == history.planted_commit
    # Summed over lifetimes; with lifetimes in parallel the sum exceeds the wall time, so the
    # rest is only shown when it is what the serial loop spent outside lifetimes.
    rest = (f", search and the rest {breakdown['other_s']:.1f}s" if breakdown["other_s"] >= 0
            else " (summed over lifetimes that ran in parallel)")
    click.echo(
        "wall time {total_s:.1f}s: artifacts {artifacts_s:.1f}s, boots {boot_s:.1f}s, probes "
        "{probe_s:.1f}s, teardown {teardown_s:.1f}s".format(**breakdown)
        + rest + "; total / sum of lifetimes = {ratio:.2f}".format(**breakdown)
    )
    from bisect_tool.demo.summary import DemoOutcome, format_summary

    interval = summary.get("p_interval")
    click.echo(
        format_summary(
            DemoOutcome(
                found_commit=summary.get("flip_commit"),
                planted_commit=history.planted_commit,
                confidence=summary.get("confidence"),
                p_estimate=summary.get("p_estimate"),
                p_interval=(float(interval[0]), float(interval[1])) if interval else None,
                lifetimes=len(observations),
                inconclusive=sum(o.verdict not in (Verdict.CLEAN, Verdict.DIVERGENT)
                                 for o in observations),
                wall_s=wall,
                report_path=_shown(report_path),
                plot_path=_shown(plot_path) if plot_path else None,
                narrow_runs=len(narrow_runs),
                history=_shown(repo),
                recipe=_shown(recipe_path),
                good=history.good_tag,
                bad=history.bad_tag,
                activate=_activate(),
            )
        ),
        nl=False,
    )
    return found


def _activate() -> str | None:
    """The virtualenv's activate script, where `bisect` is not on the reader's PATH (`make demo`
    runs .venv/bin/bisect; the commands the summary prints say plain `bisect`)."""
    import shutil
    import sys

    here = Path(sys.prefix) / "bin"
    found = shutil.which("bisect")
    if sys.prefix == sys.base_prefix or (found and Path(found).parent.resolve() == here.resolve()):
        return None
    script = here / "activate"
    return _shown(script) if script.is_file() else None


def _shown(path: Path) -> str:
    """A path as the summary shows it: relative to the current folder when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


def _write_report(journal_path: Path, out: Path) -> tuple[Path, Path | None, str]:
    """The Markdown report and the posterior plot, written under ``out`` (kept after the run)."""
    from bisect_tool.demo.summary import PLOT_NAME, REPORT_NAME
    from bisect_tool.report import render_report

    out.mkdir(parents=True, exist_ok=True)
    plot = (out / PLOT_NAME).resolve()
    plot.unlink(missing_ok=True)  # a stale plot from an earlier run must not be reported
    # linked relative to the report beside it: the folder can move, or be attached whole
    markdown = render_report(journal_path, "md", plot, link_from=out)
    report = out / REPORT_NAME
    report.write_text(markdown + "\n")
    return report.resolve(), (plot.resolve() if plot.exists() else None), markdown


#: The bundled recipes of the demo history that write_recipe completes: ``demo`` bisects the
#: compiled-side fix, ``demo-python`` the Python-side regression (recipes/*.toml say how).
DEMO_RECIPES = ("demo", "demo-python")


def write_recipe(path: Path, cache_dir: Path, *, image: str = "", name: str = "demo",
                 wheel_index: str = "") -> Path:
    """Write the bundled demo recipe ``name`` (one of ``DEMO_RECIPES``), completed for this
    machine, to ``path``; validated.

    The bundled demo recipes leave the pinned stack's location and the cache to run time: they
    depend on where bisect-tool is installed and on the work dir. With ``image`` lifetimes run
    in containers of that image (``[runtime] backend = "docker"``). Candidates are still built
    on the host (``build_executor = "host"``): the host and the base image are both Debian
    bookworm, and the compatibility gate loads each candidate's ``_kernels.so`` inside the image
    before a lifetime trusts it.
    """
    from bisect_tool.demo import pinned
    from bisect_tool.recipes import recipe as recipe_mod

    if name not in DEMO_RECIPES:
        raise UsageError(f"no demo recipe {name!r}; the demo has {', '.join(DEMO_RECIPES)}")
    import tomlkit

    # edited as TOML (tomlkit: the bundled file's comments stay), not as lines of text
    doc = tomlkit.parse(recipe_mod.find(name).read_text())
    runtime, artifacts = doc["runtime"], doc["artifacts"]
    assert isinstance(runtime, dict) and isinstance(artifacts, dict)
    runtime["pinned_package_dir"] = str(pinned.STACK_DIR)
    artifacts["cache_dir"] = str(cache_dir)
    if wheel_index:
        # the demo's per-commit wheel index first (bisect_tool.demo.wheels), the build after;
        # its pinned stack stands for a build against CUDA 13.0
        if list(artifacts.get("sources", [])) != ["source-build"]:
            raise UsageError(f"the bundled {name} recipe's sources are not [\"source-build\"]")
        artifacts["sources"] = ["wheel-index", "source-build"]
        artifacts["wheel_index_url"] = wheel_index
        artifacts["variant"] = "cu130"
    if image:
        if runtime.get("backend") != "local":
            raise UsageError(f"the bundled {name} recipe has no [runtime] backend to switch")
        runtime["backend"] = "docker"
        runtime["image"] = image
        # The recipe's "GPU" ids only bound how many local lifetimes run at once; Docker would
        # ask its (absent) GPU driver for them. Containers run one lifetime at a time.
        runtime["gpus"] = []
    text = tomlkit.dumps(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    recipe_mod.load(str(path))  # validate before anything starts
    return path


def _demo_image() -> str:
    """The demo image's tag, built from bisect-base:bookworm when missing (once; by digest)."""
    from bisect_tool.demo import image

    with image.docker_client() as client:
        return image.ensure_image(client, progress=lambda m: click.echo(m, err=True))


def _breakdown(observations: Sequence[Observed], wall: float) -> dict[str, float]:
    sums = {"artifacts_s": 0.0, "boot_s": 0.0, "probe_s": 0.0, "teardown_s": 0.0}
    lifetimes = 0.0
    for o in observations:
        timing = o.detail.get("timing", {})
        for key in sums:
            sums[key] += float(timing.get(key, 0.0)) if isinstance(timing, dict) else 0.0
        lifetimes += o.duration_s
    other = wall - sum(sums.values())
    return {
        "total_s": round(wall, 2),
        **{k: round(v, 2) for k, v in sums.items()},
        "other_s": round(other, 2),
        "ratio": round(wall / lifetimes, 3) if lifetimes else 0.0,
    }
