"""A random checkpoint says how it was made (issue 32, item 2): the report's "reproduce" gives a
maintainer the command, seed and transformers version that make the same checkpoint, not the
published weights the run never loaded. torch and transformers are stand-ins here (the real
ones are not installed on this machine); what is checked is what the tool writes and reads."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from bisect_tool.recipes import recipe as recipe_mod
from bisect_tool.runtime.cli import WEIGHTS_RECORD, make_random_checkpoint


class _Model:
    def save_pretrained(self, out: str, safe_serialization: bool = True) -> None:
        Path(out, "model.safetensors").write_bytes(b"weights")
        Path(out, "config.json").write_text("{}")


@pytest.fixture
def fake_stack(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    torch = types.ModuleType("torch")
    torch.__version__ = "2.11.0+cu130"  # type: ignore[attr-defined]
    torch.float16 = "f16"  # type: ignore[attr-defined]
    torch.manual_seed = lambda s: seen.setdefault("seed", s)  # type: ignore[attr-defined]
    transformers = types.ModuleType("transformers")
    transformers.__version__ = "4.57.1"  # type: ignore[attr-defined]
    transformers.AutoConfig = types.SimpleNamespace(  # type: ignore[attr-defined]
        from_pretrained=lambda path: seen.setdefault("config", path))
    transformers.AutoModelForCausalLM = types.SimpleNamespace(  # type: ignore[attr-defined]
        from_config=lambda cfg, dtype: _Model())
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "transformers", transformers)
    return seen


def test_the_bundled_config_is_named_as_recipes_name_it(
    fake_stack: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bisect model random --config models/qwen3-0.6b` from any folder: the bundled config
    the batch-invariance recipe's weights use."""
    monkeypatch.chdir(tmp_path)
    out = make_random_checkpoint(Path("models/qwen3-0.6b"), tmp_path / "ckpt")
    bundled = recipe_mod.BUNDLED_DIR / "models" / "qwen3-0.6b"
    assert fake_stack["config"] == str(bundled) and fake_stack["seed"] == 0
    record = json.loads((out / WEIGHTS_RECORD).read_text())
    import hashlib

    assert record == {
        "config_sha256": hashlib.sha256((bundled / "config.json").read_bytes()).hexdigest(),
        "dtype": "float16", "seed": 0, "torch": "2.11.0+cu130", "transformers": "4.57.1",
        # the checkpoint's own digests, for the report's reproduce step to check (issue 41)
        "files": {"model.safetensors": hashlib.sha256(b"weights").hexdigest()},
    }
