"""The environment the lifetimes ran in, and every way it differs from what the issue reported
(issue 32, item 3: ``VLLM_USE_FLASHINFER_SAMPLER=0``, the compiled files left out of the pinned
install, the dependency versions, the workload's size and jitter). Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from bisect_tool.journal import JournalContents
from bisect_tool.report.names import no_local_paths
from bisect_tool.report.text import esc

_ORDER = ("gpu", "gpus", "driver", "cuda", "torch", "vllm", "pinned", "pinned_stack", "image",
          "python", "platform", "host", "hostname")
#: what a maintainer reads first, in this order: (key, label)
_ROWS = (("driver", "Driver"), ("cuda", "CUDA"), ("torch", "PyTorch"), ("triton", "Triton"),
         ("flashinfer", "FlashInfer"), ("transformers", "transformers"), ("python", "Python"))
NOT_RECORDED = "not recorded by this run"


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    # kept whole: how the checkpoint was made, and a Python side's files by their hashes
    if isinstance(value, Mapping) and prefix != "weights" and not prefix.endswith(".files"):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, list | tuple):
        out[prefix] = ", ".join(str(v) for v in value)
    else:
        out[prefix] = value


def merged(contents: JournalContents) -> dict[str, Any]:
    """All ``environment`` entries merged (a later fact wins), nested keys flattened; versions
    listed under ``versions`` count as the plain keys (``versions.torch`` is ``torch``), the
    package's own as the pinned Python side's."""
    found: dict[str, Any] = {}
    for entry in contents.of_type("environment"):
        _flatten("", {k: v for k, v in entry.items() if k not in ("type", "seq", "time")}, found)
    package = str(((contents.header.get("recipe") or {}).get("artifacts") or {}).get("package")
                  or "vllm")
    for key in [k for k in found if k.startswith("versions.")]:
        plain = key.removeprefix("versions.")
        found.setdefault("pinned_version" if plain == package else plain, found[key])
    first = [k for k in _ORDER if k in found]
    return {k: found[k] for k in [*first, *sorted(set(found) - set(first))]}


def _recorded_all(env: Mapping[str, Any]) -> bool:
    """The environment entry is of a tool that asks for every package it lists (FlashInfer
    absent there means not installed, not unknown)."""
    return "missing_extensions" in env or any(k.startswith("compiled_files.") for k in env)


NOT_CHECKED = "not checked"


def compiled_files(env: Mapping[str, Any]) -> tuple[list[str] | None, str]:
    """(the pinned package's compiled files missing from its install, or None where that was not
    checked; the words saying so). Checked against the wheel's own file list (its RECORD); a run
    before that check recorded an empty list also where it had no list to check against (issue
    41: "none" where deep_gemm, _moe_C, FA2, flashmla and qutlass were absent), so an empty list
    of such a run is "not checked", and only a list it did find is believed."""
    if "compiled_files.against" in env:
        missing = [m for m in str(env.get("compiled_files.missing") or "").split(", ") if m]
        listed = env.get("compiled_files.listed")
        # "the RECORD of vllm 0.26.0" as the report spells a release: vllm v0.26.0
        record = re.sub(r"\b(\d+\.\d+\.\d+)", r"v\1", str(env["compiled_files.against"]))
        against = f"{record}, the wheel's file list"
        if missing:
            return missing, f"{', '.join(missing)} (of the {listed} in {against})"
        return [], f"none of the {listed} in {against}"
    if "compiled_files.not_checked" in env:
        return None, f"{NOT_CHECKED}: {env['compiled_files.not_checked']}"
    old = env.get("missing_extensions")
    if old:
        return [m for m in str(old).split(", ") if m], str(old)
    if "missing_extensions" in env:
        return None, (f"{NOT_CHECKED}: this run's tool could not tell an install without the "
                      "wheel's file list from one missing nothing")
    return None, NOT_RECORDED


def attention_words(lifetimes: Sequence[Mapping[str, Any]]) -> str | None:
    """The attention backend vLLM chose in each lifetime (from its server log), in a few words:
    "FLASH_ATTN in all 10 lifetimes", or each backend with the candidates it ran under."""
    seen: dict[str, list[str]] = {}
    servers = 0
    for lt in lifetimes:
        detail = lt.get("detail") or {}
        if "mode" not in detail:  # not a server lifetime (an op run, a gate's refusal)
            continue
        servers += 1
        backend = detail.get("attention_backend")
        if backend:
            seen.setdefault(str(backend), []).append(str(lt.get("name")))
    if not seen:
        return None
    if len(seen) == 1:
        backend, names = next(iter(seen.items()))
        return (f"{backend} in all {servers} lifetimes" if len(names) == servers else
                f"{backend} in {len(names)} of {servers} lifetimes (the others' logs name none)")
    return "; ".join(f"{b} ({', '.join(sorted(set(n)))}: {len(n)} lifetimes)"
                     for b, n in sorted(seen.items()))


def _version(env: Mapping[str, Any], key: str) -> str:
    value = env.get("pinned_version") if key == "vllm" else env.get(key)
    if value:
        return str(value)
    return "not installed" if _recorded_all(env) and key != "vllm" else NOT_RECORDED


def weights_words(recipe: Mapping[str, Any], env: Mapping[str, Any]) -> str:
    runtime = recipe.get("runtime") or {}
    weights = str(runtime.get("weights") or "")
    model = str(runtime.get("model") or "")
    if weights.startswith("random"):
        made = env.get("weights") if isinstance(env.get("weights"), Mapping) else {}
        how = (f", seed {made.get('seed')}, {made.get('dtype')}, made with transformers "
               f"{made.get('transformers')} and torch {made.get('torch')}" if made else "")
        shape = PurePosixPath(weights.partition(":")[2]).name or model
        return (f"a random checkpoint shaped like {model or shape}, at its config's "
                f"initializer scale{how}")
    return model or "-"


def block(env: Mapping[str, Any], recipe: Mapping[str, Any],
          tested: Sequence[Mapping[str, Any]],
          lifetimes: Sequence[Mapping[str, Any]] = ()) -> list[tuple[str, str]]:
    """(what, value) rows of the environment block, in the order a maintainer reads them."""
    rows: list[tuple[str, str]] = []
    if env.get("gpu"):
        cc = env.get("compute_capability")
        rows.append(("GPU", f"{env['gpu']}" + (f" (compute capability {cc})" if cc else "")))
    for key, label in _ROWS:
        if env.get(key):
            # Python: its version and which interpreter ran the lifetimes (the recipe's, or
            # the tool's own), named without the directories it sits in on this machine
            rows.append((label, no_local_paths(str(env[key]))))
    package = str((recipe.get("artifacts") or {}).get("package") or "vllm")
    if env.get("pinned_version"):
        rows.append((f"{package} (the pinned Python side)", str(env["pinned_version"])))
    runtime = recipe.get("runtime") or {}
    vllm_server = str(runtime.get("server_module") or "").startswith("vllm")
    if vllm_server or _recorded_all(env):
        rows.append((f"Compiled files of {package} missing from the pinned install",
                     compiled_files(env)[1]))
    if vllm_server:
        rows.append(("Attention backend (vLLM's choice, from the server log)",
                     attention_words(lifetimes) or NOT_RECORDED))
    backend = env.get("backend") or runtime.get("backend")
    if backend:
        rows.append(("Backend", str(backend) + (f", image {env['image']}" if env.get("image")
                                                else "")))
    if runtime.get("weights") or runtime.get("model"):
        rows.append(("Weights", weights_words(recipe, env)))
    for r in tested:
        for rel, digest in sorted((r.get("swap_sha256") or {}).items()):
            rows.append((f"{PurePosixPath(rel).name} of {r['name']}", f"sha256 {digest}"))
    return rows


def _flat(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = json.dumps(value, sort_keys=True, default=list)


def reported_setup(recipe: Mapping[str, Any], bundled: Mapping[str, Any] | None
                   ) -> tuple[Mapping[str, Any] | None, list[tuple[str, str, str]]]:
    """(what the issue reported, where the run's recipe says otherwise).

    What the issue reported is read from the bundled recipe the run's is named after, not from
    the run's copy: a copy is edited for a machine, and an edit can reach ``[reported]`` too
    (issue 41: the H100 script's sed set ``VLLM_USE_FLASHINFER_SAMPLER=0`` in ``[runtime.env]``
    and ``[reported.env]`` alike, so the one setting #51187's thread argued about was no
    difference). A recipe of its own (no bundled one of its name) says it itself. The second
    value lists each ``[reported]`` key the run's copy changed, as (key, bundled, run's), for the
    report to flag."""
    mine = recipe.get("reported") or None
    theirs = (bundled or {}).get("reported") or None
    if not theirs:
        return mine, []
    if not mine:
        return theirs, []
    a: dict[str, str] = {}
    b: dict[str, str] = {}
    _flat("", theirs, a)
    _flat("", mine, b)
    changed = [(key, a.get(key, "unset"), b.get(key, "unset"))
               for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
    return theirs, changed


def reported_warning(diff: Mapping[str, Any] | None) -> list[str]:
    """A GitHub alert, as Markdown lines, naming each ``[reported]`` value the run's recipe
    changed (none when it changed nothing)."""
    changed = (diff or {}).get("reported_changed") or []
    if not changed:
        return []

    def shown(value: str) -> str:
        return "unset" if value == "unset" else f"`{json.loads(value)}`"

    what = "; ".join(f"`{key}` is {shown(run)} there, {shown(bundled)} as reported"
                     for key, bundled, run in changed)
    issue = str((diff or {}).get("issue") or "the issue")
    return ["> [!WARNING]",
            f"> This run's recipe changes what {esc(issue)} reported (its `[reported]` table): "
            f"{what}. The differences below are against the bundled recipe's, which is what "
            "the issue reported.", ""]


def _options(args: Sequence[str]) -> dict[str, str]:
    """Server arguments as {--flag: value or ""}."""
    out: dict[str, str] = {}
    items = [str(a) for a in args]
    for i, arg in enumerate(items):
        if arg.startswith("--"):
            nxt = items[i + 1] if i + 1 < len(items) else ""
            out[arg] = "" if nxt.startswith("--") else nxt
    return out


def differences(env: Mapping[str, Any], recipe: Mapping[str, Any],
                reported: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Where the run differs from the setup the issue reported (``[reported]`` of the recipe,
    or of the bundled recipe of its name): rows of (what, reported, this run)."""
    if not reported or not any(reported.values()):
        return None
    runtime = recipe.get("runtime") or {}
    probe = recipe.get("probe") or {}
    rows: list[tuple[str, str, str]] = []
    if reported.get("gpu"):
        here = env.get("gpu")
        cc = env.get("compute_capability")
        rows.append(("GPU", str(reported["gpu"]),
                     f"{here}" + (f" (compute capability {cc})" if cc else "") if here
                     else NOT_RECORDED))
    for package, version in (reported.get("versions") or {}).items():
        here = _version(env, str(package))
        if here.split(" ")[0] != str(version).split(" ")[0]:
            rows.append((str(package), str(version), here))
    if reported.get("model"):
        rows.append(("Model", str(reported["model"]), weights_words(recipe, env)))
    mine = {str(k): str(v) for k, v in (runtime.get("env") or {}).items()}
    theirs = {str(k): str(v) for k, v in (reported.get("env") or {}).items()}
    for key in sorted(set(mine) | set(theirs)):
        if mine.get(key) != theirs.get(key):
            rows.append((f"`{key}`", theirs.get(key, "unset"), mine.get(key, "unset")))
    if reported.get("server_args"):
        ours, others = _options(runtime.get("server_args") or ()), _options(
            reported["server_args"])
        only_theirs = [f"{k} {v}".strip() for k, v in others.items() if ours.get(k) != v]
        only_ours = [f"{k} {v}".strip() for k, v in ours.items() if others.get(k) != v]
        if only_theirs or only_ours:
            rows.append(("Server arguments", " ".join(only_theirs) or "-",
                         " ".join(only_ours) or "-"))
    if reported.get("requests") and probe.get("requests") is not None:
        size = (int(reported["requests"]), int(reported.get("fillers") or 0))
        ours_size = (int(probe.get("requests") or 0), int(probe.get("fillers") or 0))
        if size != ours_size:
            rows.append(("Workload", f"{size[0]} requests + {size[1]} fillers",
                         f"{ours_size[0]} requests + {ours_size[1]} fillers"))
    jitter = float(probe.get("jitter_ms") or 0.0)
    if jitter != float(reported.get("jitter_ms") or 0.0):
        rows.append(("Arrival of requests",
                     _arrival(float(reported.get("jitter_ms") or 0.0)), _arrival(jitter)))
    package = str((recipe.get("artifacts") or {}).get("package") or "vllm")
    missing, words = compiled_files(env)
    if missing:
        rows.append((f"Compiled files of {package}", "all of the wheel's",
                     f"without {', '.join(missing)}"))
    elif missing is None:
        rows.append((f"Compiled files of {package}", "all of the wheel's",
                     NOT_RECORDED if words == NOT_RECORDED else NOT_CHECKED))
    return {"issue": reported.get("issue") or "the issue", "rows": rows,
            "workload": reported.get("workload") or None}


def _arrival(jitter_ms: float) -> str:
    if jitter_ms <= 0:
        return "all at once"
    return f"0-{jitter_ms:g} ms of random delay per request"


def short_list(diff: Mapping[str, Any] | None) -> tuple[list[str], list[str]]:
    """(what differs, what the run did not record), by name, as Markdown for the report's
    first lines (the Environment section's table has the values)."""
    if not diff:
        return [], []
    out: list[str] = []
    unknown: list[str] = []
    for what, _, here in diff["rows"]:
        label = str(what)
        if label.startswith("`"):  # an environment variable: as the run set it
            key = label.strip("`")
            label = f"`{key}={here}`" if here != "unset" else f"`{key}` unset"
        elif label in _VERSION_LABELS:
            label = f"{_VERSION_LABELS[label]} version"
        else:
            label = label[0].lower() + label[1:] if label[:2] != "GP" else label
        (unknown if here in (NOT_RECORDED, NOT_CHECKED) else out).append(label)
    return out, unknown


_VERSION_LABELS = {"flashinfer": "FlashInfer", "torch": "PyTorch", "triton": "Triton",
                   "vllm": "vLLM", "transformers": "transformers"}
