"""The bundled recipes load against the schema, and malformed recipes fail with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bisect_tool import recipe
from bisect_tool.demo.model_facts import DEMO_VOCAB_SIZE
from bisect_tool.demo.pinned import BUILD_COMMAND, SERVER_MODULE, SWAP_PATH
from bisect_tool.errors import RecipeError


def test_bundled_recipes_are_listed_and_load() -> None:
    assert recipe.bundled_names() == [
        "batch-invariance", "batch-invariance-op", "demo", "demo-op", "demo-python",
        "tp-batch-invariance",
    ]
    for name in recipe.bundled_names():
        assert recipe.load(name).name == name


def test_batch_invariance_recipe_is_the_seed_setup() -> None:
    r = recipe.load("batch-invariance")
    assert r.artifacts.swap_set == ("vllm/_C_stable_libtorch.abi3.so",)
    assert r.range.paths == ("csrc/", "cmake/", "CMakeLists.txt", "setup.py")
    assert r.runtime.server_module == "vllm.entrypoints.openai.api_server"
    assert r.runtime.env == {"VLLM_BATCH_INVARIANT": "1"}
    assert "--no-enable-prefix-caching" in r.runtime.server_args
    assert "dummy" not in " ".join(r.runtime.server_args)  # dummy weights hide the bug
    assert r.runtime.weights == "random:models/qwen3-0.6b"
    p = r.probe
    assert (p.requests, p.fillers, p.prefix_tokens, p.repeats, p.max_tokens, p.logprobs) == (
        31,
        13,
        16,
        5,
        24,
        5,
    )
    assert (p.jitter_ms, p.vocab_size) == (40.0, 151_936)


def test_op_recipe() -> None:
    p = recipe.load("batch-invariance-op").probe
    assert p.kind == "op"
    assert p.ops == ("rms_norm", "fused_add_rms_norm")
    assert p.row_counts == (255, 300)
    assert p.hidden_sizes == (512, 4096)
    assert (p.seeds, p.dtypes) == (16, ("float16",))


def test_demo_recipe_matches_the_demo_target() -> None:
    r = recipe.load("demo")
    assert r.artifacts.swap_set == (SWAP_PATH,)
    assert r.artifacts.build_command == BUILD_COMMAND
    assert r.artifacts.build_executor == "host"
    assert r.runtime.server_module == SERVER_MODULE
    assert r.runtime.pinned_package_dir == ""  # filled in by `bisect demo`
    assert r.probe.vocab_size == DEMO_VOCAB_SIZE
    assert r.runtime.env == {"VLLM_BATCH_INVARIANT": "1"}


def test_template_uncommented_is_the_defaults(tmp_path: Path) -> None:
    text = (recipe.BUNDLED_DIR / "_template.toml").read_text()
    lines = [
        line.removeprefix("# ")
        for line in text.splitlines()
        if not line.startswith("# ") or "=" in line or line.startswith("# [")
    ]
    path = tmp_path / "t.toml"
    path.write_text("\n".join(lines) + "\n")
    assert recipe.load(str(path)) == recipe.Recipe(name="my-recipe", source=str(path))
    assert "_template" not in recipe.bundled_names()


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "r.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('name = "x"\n[probe]\nrepeatz = 5\n', "unknown key 'repeatz' in [probe]"),
        ('name = "x"\nflavour = 1\n', "unknown key 'flavour' at top level"),
        ('name = "x"\n[probe]\nrepeats = "5"\n', "'probe.repeats' must be an integer"),
        ('name = "x"\n[probe]\nrepeats = true\n', "'probe.repeats' must be an integer"),
        ('name = "x"\n[artifacts]\nswap_set = "a.so"\n', "'artifacts.swap_set' must be a list"),
        ('name = "x"\n[probe]\nrow_counts = [1, 2, 3]\n', "exactly 2 items"),
        ('name = "x"\n[runtime.env]\nA = 1\n', "'runtime.env.A' must be a string"),
        ('name = "x"\nprobe = 3\n', "[probe] must be a table"),
        ('description = "no name"\n', "missing field 'name'"),
        ('name = "x\n', "not valid TOML"),
    ],
)
def test_malformed_recipes_give_one_line_errors(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(RecipeError) as info:
        recipe.load(_write(tmp_path, text))
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_recipe_name_lists_the_bundled_ones() -> None:
    with pytest.raises(RecipeError, match="bundled recipes: batch-invariance, batch-invariance-op"):
        recipe.load("batch-invariant")
