"""The compatibility gate: does a candidate's extension register the ops the pinned stack calls?

vLLM's op schemas change across commits (``rms_norm`` once took a required ``weight``, now
``Tensor? weight``: see vllm-facts.md), and the pinned Python calls ``torch.ops._C.rms_norm``
with the pinned signature. A candidate whose schema differs would fail (or worse, misbehave) for
reasons unrelated to the bug, so it is UNTESTABLE, not bad.

The dump runs in a subprocess of the pinned interpreter, one library per process (loading two
builds of one extension into one process fails: the ops are already registered). With torch it
diffs ``torch._C._jit_get_all_schemas()`` before and after ``torch.ops.load_library``; without
torch (the demo engine's plain C library) it loads the library with ctypes and reads
``const char *bisect_op_schemas(void)`` (newline-separated schema lines) when exported.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence

from bisect_tool.errors import IncompatibleExtension, InfrastructureError
from bisect_tool.interfaces import SwapSet
from bisect_tool.values import short

# Runs under the *pinned* interpreter (any Python >= 3.8; torch optional). Prints one JSON object.
DUMP_SCRIPT = r"""
import ctypes, json, os, sys

path, namespace = sys.argv[1], sys.argv[2]
out = {"schemas": {}, "torch": False, "error": None}
if not os.path.isfile(path):
    print(json.dumps({"missing": True}))
    sys.exit(0)

def key_of(line):
    head = line.split("(", 1)[0].strip()
    return head

try:
    import torch
except Exception:
    torch = None
if torch is not None:
    out["torch"] = True
    try:
        before = {str(s) for s in torch._C._jit_get_all_schemas()}
        torch.ops.load_library(path)
        for s in torch._C._jit_get_all_schemas():
            text = str(s)
            if text in before:
                continue
            if namespace and not s.name.startswith(namespace + "::"):
                continue
            out["schemas"][key_of(text)] = text
    except Exception as exc:
        out["error"] = "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
if out["error"] is None:
    try:
        lib = ctypes.CDLL(path)
        fn = getattr(lib, "bisect_op_schemas", None)
        if fn is not None:
            fn.restype = ctypes.c_char_p
            for line in (fn() or b"").decode().splitlines():
                line = line.strip()
                if line and (not namespace or line.startswith(namespace + "::")):
                    out["schemas"][key_of(line)] = line
    except OSError as exc:
        out["error"] = "OSError: %s" % exc
print(json.dumps(out))
"""

_SPACES = re.compile(r"\s+")


def _normal(schema: str) -> str:
    return _SPACES.sub(" ", schema.strip())


def compare_schemas(pinned: Mapping[str, str], candidate: Mapping[str, str]) -> list[str]:
    """Problems that make the candidate's extension unusable by the pinned Python, sorted by op.

    An op of the pinned extension that the candidate lacks, or whose schema differs, is a
    problem; extra ops in the candidate are fine (nothing pinned calls them).
    """
    problems: list[str] = []
    for op in sorted(pinned):
        if op not in candidate:
            problems.append(f"candidate lacks op {op}")
        elif _normal(pinned[op]) != _normal(candidate[op]) and not _extends(
            pinned[op], candidate[op]
        ):
            problems.append(
                f"op {op} changed: pinned '{pinned[op]}' vs candidate '{candidate[op]}'"
            )
    return problems


def _split_schema(schema: str) -> tuple[str, list[str], str] | None:
    """``name(arg, arg=default) -> ret`` as (name, args, ret); None when it does not parse."""
    text = _normal(schema)
    open_at = text.find("(")
    if open_at < 0:
        return None
    args: list[str] = []
    depth, current = 0, ""
    for index in range(open_at + 1, len(text)):
        ch = text[index]
        if ch in ")]" and depth == 0:
            if current.strip():
                args.append(current.strip())
            return text[:open_at], args, text[index + 1 :].strip()
        if ch == "," and depth == 0:
            args.append(current.strip())
            current = ""
            continue
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        current += ch
    return None


def _extends(pinned: str, candidate: str) -> bool:
    """The candidate only appends arguments with defaults: old callers still work.

    Seen between vLLM 0.26.0 and 0.27.0: ``_C::dsv3_fused_a_gemm`` gained
    ``bool enable_pdl=False``; the pinned 0.26.0 Python calls it without that argument.
    """
    old, new = _split_schema(pinned), _split_schema(candidate)
    if old is None or new is None or old[0] != new[0] or old[2] != new[2]:
        return False
    old_args, new_args = old[1], new[1]
    return (
        len(new_args) > len(old_args)
        and new_args[: len(old_args)] == old_args
        and all("=" in a for a in new_args[len(old_args) :])
    )


def parse_dump(stdout: str, what: str) -> dict[str, str] | None:
    """The schemas from DUMP_SCRIPT's output (``None``: no such file); a library that does not
    load is incompatible."""
    last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    try:
        data = json.loads(last)
    except json.JSONDecodeError:
        raise InfrastructureError(
            f"schema dump of {what} printed no result: {last[:200]!r}"
        ) from None
    if data.get("missing"):
        return None
    if data.get("error"):
        raise IncompatibleExtension(f"{what} does not load in the pinned stack: {data['error']}")
    return {str(k): str(v) for k, v in data.get("schemas", {}).items()}


def dump_command(python: str, path: str, namespace: str = "") -> list[str]:
    return [python, "-c", DUMP_SCRIPT, path, namespace]


def dump_local(
    python: str, path: str, *, what: str, namespace: str = "", timeout_s: float = 300.0
) -> dict[str, str] | None:
    """Run the dump under ``python`` on this machine (the local backend's pinned stack)."""
    try:
        done = subprocess.run(
            dump_command(python, path, namespace),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except FileNotFoundError:
        raise InfrastructureError(
            f"pinned interpreter not found: {python}; set [runtime] python in the recipe"
        ) from None
    except subprocess.TimeoutExpired:
        raise InfrastructureError(f"schema dump of {what} took over {timeout_s:g} s") from None
    if done.returncode != 0:
        # A crash while loading (e.g. a segfault in a static initialiser) is the candidate's.
        err = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise IncompatibleExtension(f"{what} does not load in the pinned stack: {err}")
    return parse_dump(done.stdout, what)


def check_pair(
    swap_path: str, pinned: Mapping[str, str], candidate: Mapping[str, str], commit: str
) -> None:
    problems = compare_schemas(pinned, candidate)
    if problems:
        # every op named (issue 32: "(and 3 more)" left a reader to guess which); the schemas
        # in full for the first one only
        others = [_op_of(p) for p in problems[1:]]
        more = f" (and {len(others)} more: {', '.join(others)})" if others else ""
        raise IncompatibleExtension(f"candidate {short(commit)}: {swap_path}: {problems[0]}{more}")


def _op_of(problem: str) -> str:
    """The op a ``compare_schemas`` problem names, with what happened to it."""
    if problem.startswith("candidate lacks op "):
        return f"{problem.removeprefix('candidate lacks op ')} (missing)"
    return problem.removeprefix("op ").split(" changed:", 1)[0]


def is_extension(rel_path: str) -> bool:
    name = rel_path.rsplit("/", 1)[-1]
    return name.endswith(".so") or ".so." in name or name.endswith(".pyd")


def extension_paths(paths: Sequence[str]) -> list[str]:
    return sorted(p for p in paths if is_extension(p))


def gate_key(swap: SwapSet) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What a passed gate is remembered by: the commit and its swap files."""
    return swap.commit, tuple(sorted((k, str(v)) for k, v in swap.files.items()))


def only_ops(schemas: Mapping[str, str], ops: Sequence[str]) -> dict[str, str]:
    """The schemas of ``ops`` (``_C::rms_norm`` or plain ``rms_norm``); all when none given."""
    if not ops:
        return dict(schemas)
    wanted = set(ops)
    return {k: v for k, v in schemas.items() if k in wanted or k.split("::")[-1] in wanted}


def check_extensions(
    swap: SwapSet,
    exts: Sequence[str],
    pinned_for: Callable[[str], dict[str, str] | None],
    candidate_for: Callable[[str], dict[str, str] | None],
    ops: Sequence[str] = (),
) -> None:
    """The compatibility gate every backend shares: each swapped extension's op schemas against
    the pinned stack's (``IncompatibleExtension`` names the op). ``pinned_for(rel)`` and
    ``candidate_for(rel)`` dump the schemas where the backend runs the pinned stack. ``ops``
    ([runtime] gate_ops): only those are compared, the ops the recipe's workload calls; an op
    outside them that the pinned Python does call fails the lifetime instead (UNTESTABLE, with
    the server's log)."""
    for rel in exts:
        pinned = pinned_for(rel)
        if pinned is None:
            continue  # a file the pinned stack lacks: nothing pinned calls into it
        pinned = only_ops(pinned, ops)
        candidate = candidate_for(rel)
        if candidate is None:
            raise IncompatibleExtension(
                f"candidate file for {rel} is not visible where the pinned stack runs"
            )
        check_pair(rel, pinned, candidate, swap.commit)
