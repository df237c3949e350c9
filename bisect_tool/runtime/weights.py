"""The model a lifetime loads: ``[runtime] weights`` turned into a checkpoint path."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bisect_tool.dirs import default_cache_dir
from bisect_tool.errors import RecipeError
from bisect_tool.recipes.recipe import BUNDLED_DIR

Progress = Callable[[str], None]


def resolve_weights(recipe: Any, *, progress: Progress | None = None) -> Any:
    """Turn ``[runtime] weights`` into the model path the server loads.

    ``random:CONFIG`` (a config.json or its folder; relative to the recipe file, then to the
    bundled recipes) makes a random checkpoint at the config's initializer scale once, cached by
    the config's sha256: vLLM's ``--load-format dummy`` weights hide the batch-invariance bug
    (vllm-facts.md, "Dummy weights hide the bug"). A directory is used as it is. "" leaves the
    recipe's model and server arguments alone.
    """
    weights = recipe.runtime.weights
    if not weights:
        return recipe
    if weights.startswith("random:"):
        spec = Path(weights.split(":", 1)[1]).expanduser()
        bases = [Path(recipe.source).parent] if recipe.source else []
        candidates = [spec] if spec.is_absolute() else [b / spec for b in [*bases, BUNDLED_DIR]]
        config = next((c for c in candidates if c.exists()), None)
        if config is None:
            raise RecipeError(
                f"weights '{weights}': no config at {', '.join(map(str, candidates))}; "
                "point it at a config.json or its folder"
            )
        config_file = config / "config.json" if config.is_dir() else config
        digest = hashlib.sha256(config_file.read_bytes()).hexdigest()[:16]
        out = default_cache_dir(recipe.artifacts.cache_dir) / "models" / f"random-{digest}"
        if not (out / "config.json").exists():
            from bisect_tool.runtime.cli import make_random_checkpoint

            if progress:
                progress(f"making a random checkpoint from {config_file} in {out}")
            partial = out.with_name(out.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            make_random_checkpoint(config_file, partial)
            partial.rename(out)
        model = str(out)
    else:
        path = Path(weights).expanduser()
        if not path.is_dir():
            raise RecipeError(
                f"weights '{weights}' is neither random:CONFIG nor a checkpoint directory"
            )
        model = str(path.resolve())
    runtime = dataclasses.replace(recipe.runtime, model=model)
    return dataclasses.replace(recipe, runtime=runtime)
