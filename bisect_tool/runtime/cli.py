"""`bisect model`: make model weights for lifetimes.

Why random weights at a realistic scale: vLLM's ``--load-format dummy`` weights are tiny, the
softmax is near-uniform and perturbations fall below float32 resolution, so the batch-invariance
bug (vLLM issue #51187) never shows and CLEANs mean nothing (measured: vllm-facts.md). A random
checkpoint at the config's ``initializer_range`` (transformers' ``from_config``) shows it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
from pathlib import Path
from typing import Any

import click

from bisect_tool.errors import InfrastructureError, UsageError

DTYPES = ("float16", "bfloat16", "float32")
#: written beside a random checkpoint: the seed, dtype, torch and transformers that made it
WEIGHTS_RECORD = "bisect-weights.json"


def weight_digests(model_dir: Path) -> dict[str, str]:
    """The sha256 of each weights file of a checkpoint folder (``*.safetensors``), by name."""
    digests = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with path.open("rb") as f:
            digests[path.name] = hashlib.file_digest(f, "sha256").hexdigest()
    return digests


def config_file_of(config: Path) -> Path:
    return config / "config.json" if config.is_dir() else config


def bundled_config(config: Path) -> Path:
    """``models/qwen3-0.6b`` as the recipes name it: a path, else one of the bundled configs
    (the one a recipe's ``weights = "random:models/qwen3-0.6b"`` uses)."""
    from bisect_tool.recipes.recipe import BUNDLED_DIR

    if not config.exists() and not config.is_absolute() and (BUNDLED_DIR / config).exists():
        return BUNDLED_DIR / config
    return config


@click.group("model")
def model_group() -> None:
    """Make model weights for the runtime (e.g. a random checkpoint at a realistic scale)."""


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise InfrastructureError(
            "random weights need transformers and torch: pip install transformers torch"
        ) from None


def make_random_checkpoint(
    config: Path, out: Path, *, dtype: str = "float16", seed: int = 0
) -> Path:
    """Write a random checkpoint (safetensors + config) for ``config`` into ``out``."""
    config = bundled_config(config)
    if not config.exists():
        raise UsageError(f"config not found: {config}; give a config.json or the folder holding it")
    config_dir = config if config.is_dir() else config.parent
    if config.is_dir() and not (config / "config.json").is_file():
        raise UsageError(f"no config.json in {config}; give a config.json or the folder holding it")
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype '{dtype}'; use one of {', '.join(DTYPES)}")
    torch = _import("torch")
    transformers = _import("transformers")
    torch.manual_seed(seed)
    cfg = transformers.AutoConfig.from_pretrained(
        str(config_dir if config.name == "config.json" or config.is_dir() else config)
    )
    torch_dtype = getattr(torch, dtype)
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch_dtype)
    except TypeError:  # transformers < 4.56 calls it torch_dtype
        model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch_dtype)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    # how it was made, for the report's "reproduce" (issue 32: the report told a maintainer to
    # serve the published weights, while the run used this random checkpoint)
    (out / WEIGHTS_RECORD).write_text(json.dumps({
        "config_sha256": hashlib.sha256(config_file_of(config).read_bytes()).hexdigest(),
        "seed": seed, "dtype": dtype, "torch": str(torch.__version__),
        "transformers": str(transformers.__version__),
        # what a maintainer checks the checkpoint they make again against (issue 41)
        "files": weight_digests(out),
    }, indent=2, sort_keys=True) + "\n")
    # Tokenizer and generation files beside the config travel with it; config.json is the one
    # save_pretrained just wrote (with the dtype recorded).
    for extra in config_dir.glob("*.json"):
        if extra.name != "config.json" and not (out / extra.name).exists():
            shutil.copy2(extra, out / extra.name)
    return out


@model_group.command("random")
@click.option(
    "--config",
    "config",
    required=True,
    type=click.Path(path_type=Path),
    help="config.json (or its folder) of the model to imitate; models/qwen3-0.6b is the bundled "
    "one the batch-invariance recipe uses",
)
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(path_type=Path),
    help="folder to write the checkpoint into",
)
@click.option("--dtype", default="float16", show_default=True, type=click.Choice(DTYPES))
@click.option("--seed", default=0, show_default=True, type=int)
def random_command(config: Path, out: Path, dtype: str, seed: int) -> None:
    """A random checkpoint at the config's initializer scale (not vLLM's dummy weights)."""
    made = make_random_checkpoint(config, out, dtype=dtype, seed=seed)
    click.echo(f"random {dtype} checkpoint written to {made}")
