"""The report's facts: a bisect journal reduced to one JSON-serialisable dict, no prose.

Pure: the inputs are a journal's contents and a :class:`Standing` (the strategy's summary
after replaying that journal); no git, no network. The Markdown and JSON renderers only format
this dict, so the two outputs cannot disagree. Each noun has its module: the evidence
(``evidence``), how sure (``confidence``), the environment and the reported setup
(``environment``), the controls (``controls``), the op check's narrowing (``narrowing``), how to
reproduce (``reproduce``), the range and the releases (``span``); this one puts them
together with the answer.

Header keys read (others are ignored): ``candidates`` (``{sha, subject, pr, tags}``, old end
first), ``direction``, ``good_ref``/``bad_ref`` (as typed), ``good``/``bad`` (full SHAs; or
``good_sha``/``bad_sha``), ``recipe`` (``Recipe.to_dict()``), ``tool_version``, ``command`` (argv
list or string), ``session``, ``level``. The last ``end`` entry's ``message`` explains a stop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from bisect_tool.errors import StateError
from bisect_tool.journal import JournalContents
from bisect_tool.kinds import COMMAND, DEFAULT, find
from bisect_tool.recipes.recipe import SearchSettings
from bisect_tool.report import (
    causes,
    confidence,
    environment,
    evidence,
    narrowing,
    reproduce,
    span,
)
from bisect_tool.report.controls import controls as controls_facts
from bisect_tool.report.names import (
    RELEASE_TAG,
    VLLM_URL,
    all_releases,
    commit_entry,
    is_vllm_remote,
    lookup,
    name,
    num,
    rename,
    short_ref,
)
from bisect_tool.values import Standing

REPORT_VERSION = 3
#: below this many candidates a posterior plot shows nothing a table does not
PLOT_MIN_CANDIDATES = 8
#: PRs listed in the headline's "changes in the range" before "and N more"
PRS_SHOWN = 30

__all__ = ["PLOT_MIN_CANDIDATES", "REPORT_VERSION", "build_report", "is_vllm_remote",
           "short_ref"]


def build_report(
    contents: JournalContents,
    state: Standing,
    *,
    repo_url: str | None = None,
    bundled_recipe: Mapping[str, Any] | None = None,
    alone: float | None = None,
) -> dict[str, Any]:
    """Everything the Markdown shows, as plain JSON values.

    ``repo_url``: where commit links point; by default the vLLM repository when the journal's
    clone has it as its remote (``header["remote_url"]``), else no commit links at all (a SHA
    of a fork or a stand-in repository would 404 there). ``bundled_recipe``: the bundled recipe
    of the same name, so the reproduce section lists only the values this run changed (and its
    ``[reported]`` setup stands in for a journal older than that section). ``alone``: the
    confidence of the same journal without the op check's runs (a tiered run's lifetimes
    alone; ``render_report`` replays it).
    """
    header = contents.header
    if repo_url is None:
        if "repo_url" in header:  # the link base recorded at start (remote.clone_link_base)
            repo_url = str(header.get("repo_url") or "")
        else:
            repo_url = VLLM_URL if is_vllm_remote(str(header.get("remote_url") or "")) else ""
    repo_url = repo_url.rstrip("/")
    raw_candidates = header.get("candidates") or []
    if not raw_candidates:
        raise StateError("the journal header lists no candidates; the session never started")
    if len(state.posterior) != len(raw_candidates):
        raise StateError(
            f"posterior has {len(state.posterior)} entries but the journal lists "
            f"{len(raw_candidates)} candidates; replay the journal with the same range"
        )
    recipe: Mapping[str, Any] = header.get("recipe") or {}
    package = str((recipe.get("artifacts") or {}).get("package") or "")
    commits = [commit_entry(c, i, repo_url) for i, c in enumerate(raw_candidates)]
    for c in commits:  # a release's page where the candidate has no commit link
        tag = name(c)
        c["release_url"] = (f"{VLLM_URL}/releases/tag/{tag}" if package == "vllm"
                            and not c["commit_url"] and RELEASE_TAG.match(tag) else None)
    by_sha = {c["sha"]: c for c in commits}
    direction = state.direction or str(header.get("direction", "regression"))
    last = len(commits) - 1
    # Index 0 is the old end: good when finding a regression, bad when finding a fix.
    bad_end = 0 if direction == "fix" else last
    good_end = last if direction == "fix" else 0
    noun = "release" if header.get("level") == "release" or all_releases(commits) else "commit"

    tiers = narrowing.narrowing(contents, commits, state.tiers, recipe)
    everything, contents = contents, evidence.without_fast_probe(contents)
    tested = evidence.tested(contents, commits, bad_end, good_end)
    for r in tested:
        r["release_url"] = by_sha[r["sha"]].get("release_url")
    env = environment.merged(everything)
    rng = span.range_facts(header, commits, good_end, bad_end, direction, repo_url, package, noun)
    answer = {
        "state": state.state,
        "direction": direction,
        "noun": noun,
        "flip_block": [lookup(by_sha, s, repo_url) for s in state.flip_block],
        "confidence": num(state.confidence),
        "good_end_doubt": num(state.good_end_doubt),
        "bad_end_doubt": num(state.bad_end_doubt),
        "credible_set": [lookup(by_sha, s, repo_url) for s in state.credible_set],
        "p_median": num(state.p_median),
        "p_interval": [num(x) for x in state.p_interval],
        "q_median": num(state.q_median),
        "q_interval": [num(x) for x in state.q_interval],
        "evaluations": state.evaluations,
        "candidates_tested": state.candidates_tested,
        "bad_end_lifetimes": next((t["lifetimes"] for t in tested if t["index"] == bad_end), 0),
        "end_message": rename(_end_message(everything.end) or "", commits) or None,
        "checks": _checks(everything.end, by_sha),
    }
    rates = _rates(answer, tested, bad_end)
    lifetimes = evidence.lifetimes(contents, commits)
    untestable = evidence.untestables(contents, commits)
    pinned = env.get("pinned_version")
    python_side = _python_side(pinned, recipe, rng)
    controls = controls_facts(everything, commits, recipe, python_side)
    reported, reported_changed = environment.reported_setup(recipe, bundled_recipe)
    differences = environment.differences(env, recipe, reported)
    if differences is not None:
        differences["reported_changed"] = reported_changed
    weights = reproduce.weights(recipe, env)
    flip_pair = _flip_pair(answer, tested)
    command = reproduce.command(header.get("command"), recipe, bundled_recipe)
    demo = command is not None and command.startswith("bisect demo")  # it makes its own recipe
    return {
        "report_version": REPORT_VERSION,
        "kind": "bisect",
        "repo_url": repo_url,
        "session": header.get("session") or header.get("session_id"),
        "tool_version": header.get("tool_version"),
        "started": header.get("started"),
        "answer": answer,
        "headline": _headline(answer, rng, recipe, python_side),
        "rests_on": _rests_on(tested, good_end, bad_end, controls),
        "how_sure": confidence.how_sure(answer, tested, tiers, alone, recipe.get("search") or {},
                                        rates),
        "tiers": tiers,
        "releases": span.releases(header, commits, answer, recipe, bundled_recipe, noun),
        "previous": dict(header["previous"]) if isinstance(header.get("previous"), Mapping)
        else None,
        "range": rng,
        "prs": _prs(commits, rng, repo_url),
        "environment": env,
        "environment_block": environment.block(env, recipe, tested, lifetimes),
        "differences": differences,
        "recipe": _recipe_summary(recipe),
        "probe_kind": COMMAND.name if header.get("run_command") else str(
            (recipe.get("probe") or {}).get("kind", DEFAULT)),
        "controls": controls,
        "tested": tested,
        "lifetimes": lifetimes,
        "symptom": _symptom(recipe, bundled_recipe, tested, bad_end),
        "untestable": untestable,
        "causes": causes.groups(untestable),
        "posterior": [num(x) or 0.0 for x in state.posterior],
        "show_plot": len(commits) >= PLOT_MIN_CANDIDATES,
        "rates": rates,
        "commits": [{k: c[k] for k in ("sha", "short", "name", "subject", "pr")}
                    for c in commits],
        "reproduce": {
            "command": command,
            "recipe_file": reproduce.recipe_arg(recipe, bundled_recipe),
            "recipe_name": recipe.get("name"),
            "changes": [] if demo else reproduce.changes(recipe, bundled_recipe)[0],
            "left_out": [] if demo else reproduce.changes(recipe, bundled_recipe)[1],
            "pinned": ({"package": package, "version": pinned, "name": python_side,
                        "stack": reproduce.stack(package, str(pinned), env)}
                       if pinned else None),
            "weights": weights,
            "swap": reproduce.swap(recipe, flip_pair, repo_url),
            "lifetime": None if demo else reproduce.lifetime(recipe,
                                                             weights["dir"] if weights else None),
        },
        "run_command": header.get("run_command") or None,
        "plot": None,
    }


def _flip_pair(answer: Mapping[str, Any], tested: Sequence[Mapping[str, Any]]
               ) -> list[Mapping[str, Any]]:
    """The two candidates either side of the answer that lifetimes ran on: the last with the
    bug and the first without (the swap a maintainer repeats)."""
    block = answer["flip_block"]
    if answer["state"] != "done" or not block:
        return []
    flip = int(block[0]["index"])
    ran = [r for r in tested if r["divergent"] or r["clean"]]
    older = [r for r in ran if int(r["index"]) < flip]
    newer = [r for r in ran if int(r["index"]) >= flip]
    return [*older[-1:], *newer[:1]]


def _python_side(pinned: Any, recipe: Mapping[str, Any], rng: Mapping[str, Any]) -> str | None:
    """The pinned Python side, spelled as the range spells releases (v0.26.0)."""
    if not pinned:
        return None
    tag = str((recipe.get("range") or {}).get("release_tag") or "v{version}")
    return tag.format(version=pinned) if RELEASE_TAG.match(f"v{pinned}") else str(pinned)


def _end_message(end: Mapping[str, Any] | None) -> str | None:
    if not end:
        return None
    for value in (end.get("message"), end.get("summary")):
        if isinstance(value, str) and value:
            return value
    return None


def _checks(end: Mapping[str, Any] | None, by_sha: Mapping[str, Mapping[str, Any]]
            ) -> dict[str, Any] | None:
    """What the checks of the model saw when the run ended (the end entry's ``checks``): the
    chance that the good end shows the bug after all, and that the good side of the flip shows
    it at a rate of its own, with the good-side candidates that showed it; and the clean
    lifetimes of the good end and of the candidate next to the flip, with the chance of as many
    were each buggy at the rate they are held to (issue 38)."""
    raw = ((end or {}).get("summary") or {}).get("checks")
    if not isinstance(raw, Mapping):
        return None

    def called(sha: object) -> str:
        return name(by_sha[str(sha)]) if str(sha) in by_sha else short_ref(str(sha))

    default = SearchSettings().clean_against_rate
    rate = float(raw.get("clean_against_rate") or default)
    # the setting in words where the run set it (the recipe's [search] clean_against_rate,
    # --clean-against); absent at the default
    setting = {} if rate == default else {"clean_against_setting": f"--clean-against {rate:g}"}
    return {"good_end_not_good": num(raw.get("good_end_not_good")),
            "good_side_doubt": num(raw.get("good_side_doubt")),
            "good_side_diverged": [{"name": called(sha), "divergent": int(d), "lifetimes": int(t)}
                                   for sha, d, t in raw.get("good_side_diverged") or []],
            "clean_against_rate": rate,
            **setting,
            "clean": [{"name": called(sha), "clean": int(n), "chance": num((1 - rate) ** int(n))}
                      for sha, n in raw.get("clean") or []]}


def _headline(answer: Mapping[str, Any], rng: Mapping[str, Any], recipe: Mapping[str, Any],
              python_side: str | None) -> dict[str, Any]:
    """The answer in words: what was searched and what was found, for the first lines."""
    block = answer["flip_block"]
    fixed = answer["direction"] == "fix"
    noun = rng["noun"]
    stand_in = (f" from their merge base {short_ref(rng['merge_base'])} (where "
                f"{rng['merge_base_for']}'s branch left {rng['mainline']}; git tests it first)"
                if rng.get("merge_base") else "")
    searched = (
        f"{rng['bad_ref'] or short_ref(rng['bad_sha'])} (bad) .. "
        f"{rng['good_ref'] or short_ref(rng['good_sha'])} (good){stand_in}, "
        f"{rng['candidates']} {noun}s"
        + (f" touching {', '.join(rng['paths'])}" if rng["paths"] and noun == "commit" else "")
    )
    words = None
    if answer["state"] == "done" and len(block) == 1:
        flip = name(block[0])
        words = f"{'fixed in' if fixed else 'broken by'} {flip}"
        swap = [str(x) for x in (recipe.get("artifacts") or {}).get("swap_set") or []]
        if swap:
            files = ", ".join(f"`{PurePosixPath(x).name}`" for x in swap)
            side = f"{python_side}'s Python" if python_side else "the pinned Python side"
            words += f": its {files} under {side}"
    elif answer["state"] == "done" and block:
        words = f"{'fixed' if fixed else 'broken'} by one of {len(block)} {noun}s"
    return {"searched": searched, "words": words}


def _rests_on(tested: Sequence[Mapping[str, Any]], good_end: int, bad_end: int,
              controls: Mapping[str, Any] | None) -> dict[str, Any]:
    by_index = {int(r["index"]): r for r in tested}

    def counts(i: int) -> dict[str, Any]:
        r = by_index.get(i) or {}
        return {"lifetimes": int(r.get("lifetimes", 0)), "divergent": int(r.get("divergent", 0)),
                "clean": int(r.get("clean", 0)), "name": r.get("name")}

    def stand_in(end: int, other: int) -> dict[str, Any] | None:
        """An untestable end's nearest tested candidate toward the other end (the search
        checked it in the end's place)."""
        row = by_index.get(end)
        if row is None or row.get("verdict") != "UNTESTABLE":
            return None
        step = 1 if other > end else -1
        for i in range(end + step, other + step, step):
            near = by_index.get(i)
            if near is not None and near.get("verdict") != "UNTESTABLE":
                return {"index": i, **counts(i)}
        return None

    bad_stand_in, good_stand_in = stand_in(bad_end, good_end), stand_in(good_end, bad_end)
    taken = {good_end, bad_end} | {int(x["index"]) for x in (bad_stand_in, good_stand_in) if x}
    others = [r for r in tested if r["index"] not in taken]
    held = "not run" if controls is None else "held" if controls.get("ok") else "failed"
    return {
        "bad_end": counts(bad_end),
        "good_end": counts(good_end),
        "bad_end_stand_in": bad_stand_in,
        "good_end_stand_in": good_stand_in,
        "other_lifetimes": sum(int(r["lifetimes"]) for r in others),
        "other_candidates": len(others),
        "controls": held,
    }


def _prs(commits: Sequence[Mapping[str, Any]], rng: Mapping[str, Any], repo_url: str
         ) -> dict[str, Any]:
    """The PRs merged in the range (from ``(#NNNNN)`` in subjects), as cargo-bisect-rustc lists
    them. With the range's path filter they are the ones touching the compiled sources."""
    ends = {rng["good_end_index"], rng["bad_end_index"]}
    found = [
        {"pr": c["pr"], "subject": c["subject"], "short": c["short"],
         "url": f"{repo_url}/pull/{c['pr']}" if repo_url and c["pr"] is not None else None}
        for c in commits
        if c["pr"] is not None and (c["index"] not in ends or c["index"] == max(ends))
    ]
    return {"filtered_by_paths": bool(rng["paths"]), "items": found[:PRS_SHOWN],
            "more": max(0, len(found) - PRS_SHOWN)}


def _symptom(recipe: Mapping[str, Any], bundled: Mapping[str, Any] | None,
             tested: Sequence[Mapping[str, Any]], bad_end: int) -> dict[str, Any] | None:
    reported = str((recipe.get("probe") or {}).get("reported_symptom")
                   or ((bundled or {}).get("probe") or {}).get("reported_symptom") or "")
    if not reported:
        return None
    bad = next((r for r in tested if r["index"] == bad_end), None)
    if not (bad and bad["divergent"]):
        # the bad end untested or untestable: the candidate with the most divergent lifetimes
        shown = [r for r in tested if r["divergent"]]
        bad = max(shown, key=lambda r: r["divergent"]) if shown else bad
    seen = None
    if bad and bad["lifetimes"]:
        cores = bad.get("max_coresidency")
        seen = (
            f"{bad['divergent']} of {bad['lifetimes']} lifetimes of {bad['name']} divergent"
            + (f", up to {bad['distinct_outputs']} distinct outputs in {bad['repeats']} repeats"
               if bad.get("distinct_outputs") and bad.get("repeats") else "")
            + (f", at co-residency {cores}" if cores is not None else "")
        )
    return {"reported": reported, "seen": seen}


def _rates(answer: Mapping[str, Any], tested: Sequence[Mapping[str, Any]], bad_end: int
           ) -> dict[str, bool]:
    """Which rate estimates have lifetimes behind them (else they are their priors)."""
    flip: int | None = int(answer["flip_block"][0]["index"]) if answer["flip_block"] else None
    fix = answer["direction"] == "fix"

    def bad_side(i: int) -> bool:
        if flip is None or flip < 0:
            return i == bad_end
        return bool(i < flip) if fix else bool(i >= flip)

    conclusive = [r for r in tested if r["divergent"] or r["clean"]]
    return {
        "p_has_data": any(bad_side(int(r["index"])) for r in conclusive),
        "q_has_data": any(not bad_side(int(r["index"])) for r in conclusive),
    }


def _recipe_summary(recipe: Mapping[str, Any]) -> dict[str, Any]:
    runtime = recipe.get("runtime") or {}
    probe = recipe.get("probe") or {}
    artifacts = recipe.get("artifacts") or {}
    kind = probe.get("kind", DEFAULT)
    keys = find(kind).recipe_keys
    return {
        "name": recipe.get("name"),
        "model": runtime.get("model"),
        "weights": runtime.get("weights"),
        "backend": runtime.get("backend"),
        "env": dict(runtime.get("env") or {}),
        "server_args": list(runtime.get("server_args") or []),
        "swap_set": list(artifacts.get("swap_set") or []),
        "gate_ops": list(runtime.get("gate_ops") or []),
        "paths": list((recipe.get("range") or {}).get("paths") or []),
        "probe": {"kind": kind, **{k: probe[k] for k in keys if k in probe}},
        "confidence": (recipe.get("search") or {}).get("confidence"),
    }
