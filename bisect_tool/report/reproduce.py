"""How a maintainer reproduces the run, with nothing of the machine that ran it (issue 32,
item 2): the bisect command without its state dir and temp paths, the recipe values it changed,
the random checkpoint's exact command, the swap of each end's compiled file into the pinned
install, and one lifetime by hand. Pure."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from bisect_tool.kinds import DEFAULT, find

#: flags that name this machine's folders or only change what the terminal shows
_DROP_WITH_VALUE = ("--state-dir", "--repo", "--good-python", "--bad-python", "--cache-dir",
                    "--python")
_DROP = ("-v", "--verbose", "-q", "--quiet", "--json")
#: a recipe string that is a path on the machine that ran it ("/tmp/dev/site", "~/x",
#: "random:/work/cfg"); a URL ("https://...") is not
_LOCAL = re.compile(r"^(?:[a-z]+:)?(?:/(?!/)|~/)")
_BUNDLED_MODELS = re.compile(r"(?:^|/)bisect_tool/recipes/(models/[^/]+)/?$")
_SECTIONS = ("range", "artifacts", "runtime", "probe", "search")
MODEL_DIR = "{name}-random"


def recipe_arg(recipe: Mapping[str, Any], bundled: Mapping[str, Any] | None) -> str:
    """The recipe as a maintainer passes it: the bundled name when the run changed nothing,
    else the file's own name (its lines are listed beside it), never the machine's path."""
    name = str(recipe.get("name") or "")
    source = str(recipe.get("source") or "")
    if bundled is not None and not changes(recipe, bundled)[0]:
        return name
    return PurePosixPath(source).name if source.endswith(".toml") else name or "RECIPE.toml"


def command(argv: Any, recipe: Mapping[str, Any], bundled: Mapping[str, Any] | None
            ) -> str | None:
    """The command the run was started with, without this machine's paths (state dir, clone,
    Python sides: a maintainer has their own) and without the terminal-only flags. The demo is
    ``bisect demo``: its range is a history it generates in a temp folder."""
    if isinstance(argv, str):
        argv = shlex.split(argv)
    if not isinstance(argv, list | tuple) or not argv:
        return None
    args = [str(a) for a in argv]
    if str(recipe.get("name") or "") == "demo" and "--recipe" in args:
        return "bisect demo" + (" --lifetimes-only" if "--no-narrow" in args else "")
    out: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        flag, eq, _ = arg.partition("=")
        if flag in _DROP_WITH_VALUE:
            skip = not eq
            continue
        if arg in _DROP:
            continue
        if i > 0 and args[i - 1] == "--recipe":
            arg = recipe_arg(recipe, bundled)
        out.append(arg)
    return shlex.join(out)


def _toml(value: Any) -> str:
    """A recipe value as TOML writes it (tomlkit), a table inline as one recipe line holds it."""
    import tomlkit

    if isinstance(value, Mapping):
        inline = tomlkit.inline_table()
        inline.update({str(k): _plain(v) for k, v in value.items()})
        return str(inline.as_string())
    return str(tomlkit.item(_plain(value)).as_string())


def _plain(value: Any) -> Any:
    """JSON's values as TOML's (a journal keeps the recipe's tuples as lists)."""
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _portable(section: str, key: str, value: Any) -> tuple[Any, bool]:
    """(the value as another machine would write it, whether it is machine-local)."""
    if section == "runtime" and key == "weights" and isinstance(value, str):
        spec = value.split(":", 1)
        found = _BUNDLED_MODELS.search(spec[-1])
        if found:  # the bundled config, named as the bundled recipe names it
            return (f"{spec[0]}:{found.group(1)}" if len(spec) == 2 else found.group(1)), False
    return value, _is_local(value)


def _is_local(value: Any) -> bool:
    if isinstance(value, str):
        return bool(_LOCAL.match(value))
    if isinstance(value, Mapping):
        return any(_is_local(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_is_local(v) for v in value)
    return False


def changes(recipe: Mapping[str, Any], bundled: Mapping[str, Any] | None
            ) -> tuple[list[tuple[str, str]], list[str]]:
    """(``[section] key = value`` lines where the run's recipe differs from the bundled one,
    the keys left out because they name the machine's own folders)."""
    out: list[tuple[str, str]] = []
    local: list[str] = []
    if not bundled:
        return out, local
    for section in _SECTIONS:
        mine = recipe.get(section) or {}
        theirs = bundled.get(section) or {}
        if not isinstance(mine, Mapping) or not isinstance(theirs, Mapping):
            continue
        for key in sorted(mine):
            value, is_local = _portable(section, key, mine[key])
            # through JSON: the journal keeps lists where the recipe keeps tuples
            if json.dumps(value, sort_keys=True) == json.dumps(
                theirs.get(key), sort_keys=True, default=list
            ):
                continue
            if is_local:
                local.append(f"{section}.{key}")
            else:
                out.append((section, f"{key} = {_toml(value)}"))
    return out, local


def weights(recipe: Mapping[str, Any], env: Mapping[str, Any]) -> dict[str, Any] | None:
    """The random checkpoint's exact command (the bundled config, seed, dtype) and the
    transformers and torch that made it (recorded beside it since issue 32)."""
    runtime = recipe.get("runtime") or {}
    spec = str(runtime.get("weights") or "")
    if not spec.startswith("random:"):
        return None
    config, _ = _portable("runtime", "weights", spec)
    config = str(config).split(":", 1)[1]
    found = env.get("weights")
    made: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    seed = made.get("seed", 0)
    dtype = made.get("dtype", "float16")
    out = MODEL_DIR.format(name=PurePosixPath(config).name or "model")
    files = made.get("files")
    return {
        "config": config,
        "dir": out,
        # the checkpoint's own digests (recorded since issue 41), to check the one made again
        "files": dict(files) if isinstance(files, Mapping) else {},
        "command": shlex.join(["bisect", "model", "random", "--config", config, "--out", out,
                               "--dtype", str(dtype), "--seed", str(seed)]),
        "transformers": made.get("transformers"),
        "torch": made.get("torch"),
        "config_sha256": made.get("config_sha256"),
    }


#: the libraries whose versions the run records (runtime/environment.py), as pip names them
_PINNED_LIBRARIES = (("torch", "torch"), ("triton", "triton"), ("transformers", "transformers"),
                     ("xgrammar", "xgrammar"))
_CUDA_LOCAL = re.compile(r"\+(cu\d+)$")
_PYTHON = re.compile(r"^(\d+)\.(\d+)")


def stack(package: str, version: str, env: Mapping[str, Any]) -> list[str]:
    """The shell lines that rebuild the run's own pinned stack from what it recorded (issue 41:
    "pip install vllm==0.26.0" brought FlashInfer and every compiled file, where the run had
    neither): its Python, the package's wheel with the torch, Triton, transformers and xgrammar
    the run had, FlashInfer as the run had it (or removed), and the compiled files the run's
    install lacked removed; ``SITE`` names the install's folder afterwards."""
    from bisect_tool.report.environment import compiled_files

    python = _PYTHON.match(str(env.get("python") or ""))
    venv = f"python{python.group(1)}.{python.group(2)}" if python else "python3"
    pins = [f"{package}=={version}"]
    index = []
    for key, dist in _PINNED_LIBRARIES:
        if env.get(key):
            pins.append(f"{dist}=={env[key]}")
            cuda = _CUDA_LOCAL.search(str(env[key]))
            if key == "torch" and cuda:
                index = ["--extra-index-url", f"https://download.pytorch.org/whl/{cuda.group(1)}"]
    lines = [f"{venv} -m venv stack && . stack/bin/activate",
             shlex.join(["pip", "install", *pins, *index])]
    flashinfer = env.get("flashinfer")
    if flashinfer:
        lines.append(shlex.join(["pip", "install", f"flashinfer-python=={flashinfer}"]))
    elif "missing_extensions" in env or any(k.startswith("compiled_files.") for k in env):
        lines.append("pip uninstall -y flashinfer-python flashinfer-cubin  # this run had none")
    else:
        lines.append("# this run did not record whether FlashInfer was installed")
    lines.append(f"SITE=$(python -c 'import importlib.util, os; print(os.path.dirname(os.path."
                 f"dirname(importlib.util.find_spec(\"{package}\").origin)))')")
    missing, words = compiled_files(env)
    if missing:
        lines.append("# the compiled files this run's install lacked")
        lines += [f'rm -f "$SITE"/{shlex.quote(m)}' for m in missing]
    elif missing is None:
        lines.append(f"# compiled files: {words.split(': ', 1)[0]} by this run, so this stack "
                     "keeps all of the wheel's (the run's may have lacked some)")
    return lines


def swap(recipe: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]],
         repo_url: str) -> list[dict[str, Any]]:
    """For each candidate: where its wheel comes from and the shell lines that put its
    compiled files into the pinned install (a release from PyPI, a commit of vLLM's main from
    wheels.vllm.ai), with the sha256 the run saw; none for a candidate of another history."""
    artifacts = recipe.get("artifacts") or {}
    package = str(artifacts.get("package") or "")
    files = [str(x) for x in artifacts.get("swap_set") or []]
    if package != "vllm" or not files:
        return []
    out = []
    for c in candidates:
        tag = next((str(t) for t in c.get("tags") or [] if re.match(r"^v?\d+\.\d+", str(t))),
                   None)
        if tag:
            version = tag.removeprefix("v")
            where = f"{package}=={version}"
            download = ["pip", "download", "--no-deps", "--only-binary=:all:", where,
                        "-d", "wheels"]
            wheel = f"wheels/{package}-{version}-*.whl"
        elif repo_url and re.fullmatch(r"[0-9a-f]{40}", str(c.get("sha"))):
            download = ["pip", "download", "--no-deps", "--only-binary=:all:", package,
                        "--index-url", f"https://wheels.vllm.ai/{c['sha']}", "-d",
                        f"wheels/{c['short']}"]
            wheel = f"wheels/{c['short']}/{package}-*.whl"
        else:
            continue
        lines = [shlex.join(download)]
        for rel in files:
            lines.append(f'unzip -o {wheel} {shlex.quote(rel)} -d "$SITE"')
        digests = c.get("swap_sha256") or {}
        for rel in files:
            if rel in digests:
                lines.append(f'echo "{digests[rel]}  $SITE/{rel}" | sha256sum -c')
        seen = ("showed the bug" if c.get("divergent") else "clean" if c.get("clean") else "")
        out.append({"name": c["name"], "seen": seen, "lines": lines})
    return out


def lifetime(recipe: Mapping[str, Any], model_dir: str | None) -> dict[str, str] | None:
    """One lifetime by hand: the server exactly as a lifetime starts it (the random checkpoint
    where the run used one), then the probe client against it, on loopback."""
    runtime = recipe.get("runtime") or {}
    probe = recipe.get("probe") or {}
    module = str(runtime.get("server_module") or "")
    if not find(probe.get("kind", DEFAULT)).boots_server or not module:
        return None
    env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (runtime.get("env") or {}).items())
    model = model_dir or str(runtime.get("model") or "MODEL")
    args = [str(a) for a in runtime.get("server_args") or []]
    server = shlex.join(["python", "-m", module, *args, "--model", model, "--host", "127.0.0.1",
                         "--port", "8000"])
    name = str(recipe.get("name") or "batch-invariance")
    client = shlex.join(["bisect", "probe", "--server", "http://127.0.0.1:8000", "--recipe",
                         name])
    return {"server": (env + " " if env else "") + server, "client": client}
