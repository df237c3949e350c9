"""The bundled recipes load against the schema, and malformed recipes fail with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bisect_tool.demo.model_facts import DEMO_VOCAB_SIZE
from bisect_tool.demo.pinned import BUILD_COMMAND, SERVER_MODULE, SWAP_PATH
from bisect_tool.errors import RecipeError
from bisect_tool.recipes import recipe


def test_bundled_recipes_are_listed_and_load() -> None:
    assert recipe.bundled_names() == [
        "batch-invariance", "batch-invariance-bs1", "batch-invariance-compiled",
        "batch-invariance-moe", "batch-invariance-op", "batch-invariance-op-extended", "demo",
        "demo-op", "demo-python", "tp-batch-invariance",
    ]
    for name in recipe.bundled_names():
        assert recipe.load(name).name == name


def test_batch_invariance_recipe_is_the_seed_setup() -> None:
    r = recipe.load("batch-invariance")
    assert r.artifacts.swap_set == ("vllm/_C_stable_libtorch.abi3.so",)
    # the files a build reads: the kernels and build scripts, the torch pin, and the CUDA the
    # wheels are built for (vLLM #39878 changed every wheel from the release pipeline alone)
    assert r.range.paths[:4] == ("csrc/", "cmake/", "CMakeLists.txt", "setup.py")
    assert {"requirements/cuda.txt", ".buildkite/release-pipeline.yaml"} <= set(r.range.paths)
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
        ('name = "x"\n[probe]\nrepeatz = 5\n',
         "unknown key 'repeatz' in [probe] (did you mean 'repeats'?); known: "),
        ('name = "x"\nflavour = 1\n', "unknown key 'flavour' at top level; known: "),
        ('name = "x"\n[serch]\nconfidence = 0.9\n',
         "unknown key 'serch' at top level (did you mean 'search'?)"),
        ('name = "x"\n[runtime]\nrequests = 3\n',
         "unknown key 'requests' in [runtime] (it belongs in [probe])"),
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


def test_a_misspelt_key_is_one_line_naming_the_fix_and_exit_4(tmp_path: Path) -> None:
    from gitrepos import run_cli

    path = _write(tmp_path, 'name = "x"\n[probe]\nmax_token = 3\n')
    code, out, err = run_cli("plan", "--good", "a", "--bad", "b", "--recipe", path)
    assert code == 4 and out == ""
    assert len(err.strip().splitlines()) == 1 and "did you mean 'max_tokens'?" in err


def test_unknown_recipe_name_lists_the_bundled_ones() -> None:
    with pytest.raises(RecipeError,
                       match="bundled recipes: batch-invariance, batch-invariance-bs1, "):
        recipe.load("batch-invariant")


# -- TOML written with tomlkit, not regexes (issue 41) --------------------------------------


def test_the_demo_recipe_is_completed_as_toml_and_keeps_the_bundled_files_comments(
    tmp_path: Path,
) -> None:
    import tomllib

    from bisect_tool.demo import pinned
    from bisect_tool.demo.cli import write_recipe

    bundled = (recipe.BUNDLED_DIR / "demo.toml").read_text()
    written = write_recipe(tmp_path / "r.toml", tmp_path / "cache", image="img:1").read_text()
    comments = [line for line in bundled.splitlines() if line.lstrip().startswith("#")]
    assert comments and all(c in written.splitlines() for c in comments)
    data = tomllib.loads(written)
    assert data["artifacts"]["cache_dir"] == str(tmp_path / "cache")
    assert data["runtime"]["pinned_package_dir"] == str(pinned.STACK_DIR)
    assert (data["runtime"]["backend"], data["runtime"]["image"], data["runtime"]["gpus"]) == (
        "docker", "img:1", [])
    # nothing else changed
    before = tomllib.loads(bundled)
    for section in before:
        if isinstance(before[section], dict):
            for key, value in before[section].items():
                if (section, key) not in {("runtime", "backend"), ("runtime", "gpus"),
                                          ("runtime", "pinned_package_dir")}:
                    assert data[section][key] == value, (section, key)


def test_the_reports_changed_values_are_toml_a_recipe_can_hold() -> None:
    import tomllib

    from bisect_tool.report import reproduce

    bundled = recipe.load("batch-invariance").to_dict()
    mine = recipe.load("batch-invariance").to_dict()
    mine["runtime"] = {**mine["runtime"], "env": {"VLLM_BATCH_INVARIANT": "1", "X": 'a"b'},
                       "server_args": ["--dtype", "float16"], "lifetimes_per_gpu": 2}
    mine["probe"] = {**mine["probe"], "narrow": "", "jitter_ms": 12.5}
    lines, _ = reproduce.changes(mine, bundled)
    text = "\n".join(f"[{s}]\n{line}" for s, line in lines)
    # a section's lines in one table each, as the report writes them
    parsed: dict[str, dict[str, object]] = {}
    for section, line in lines:
        parsed.setdefault(section, {}).update(tomllib.loads(line))
    assert parsed["runtime"]["env"] == {"VLLM_BATCH_INVARIANT": "1", "X": 'a"b'}, text
    assert parsed["runtime"]["server_args"] == ["--dtype", "float16"]
    assert parsed["runtime"]["lifetimes_per_gpu"] == 2
    assert parsed["probe"] == {"narrow": "", "jitter_ms": 12.5}


# ---- issue 40's recipes -------------------------------------------------------------------------


def test_the_compiled_recipe_is_the_seed_setup_with_cuda_graphs_on() -> None:
    seed, r = recipe.load("batch-invariance"), recipe.load("batch-invariance-compiled")
    assert "--enforce-eager" in seed.runtime.server_args
    # and _C's RMSNorm kept as the custom op under compilation: without it the kernel never
    # runs there (v0.26.0 clean with graphs on; with the flag it diverged, H100 2026-12-07c)
    assert r.runtime.server_args == (*(a for a in seed.runtime.server_args
                                       if a != "--enforce-eager"),
                                     "--compilation-config", '{"custom_ops": ["+rms_norm"]}')
    assert r.probe.warmup_requests == 2 and r.runtime.boot_timeout_s > seed.runtime.boot_timeout_s
    assert r.probe.suspects == {"VLLM_USE_FLASHINFER_SAMPLER": "0,1"}
    # the seed's workload and swap set, unchanged
    assert (r.probe.requests, r.probe.fillers, r.probe.jitter_ms) == (31, 13, 40.0)
    assert r.artifacts.swap_set == seed.artifacts.swap_set and r.range == seed.range


def test_the_bs1_recipe_is_vllms_own_check_on_the_seed_workload() -> None:
    r = recipe.load("batch-invariance-bs1")
    p = r.probe
    assert (p.mode, p.batch_sizes, p.jitter_ms) == ("bs1-vs-bsN", (), 0.0)
    # alone, a prompt's prefill stays below the pre-fix kernel's 256 tokens; batched, far above
    assert p.prefix_tokens + p.prompt_tokens < 256
    assert p.requests * (p.prefix_tokens + p.prompt_tokens) + p.fillers * p.filler_tokens > 256
    assert "--enforce-eager" in r.runtime.server_args


def test_the_extended_op_recipe_adds_bf16_and_the_quantized_rms_norm_ops() -> None:
    from bisect_tool.probes.op_cases import CHECKED

    p = recipe.load("batch-invariance-op-extended").probe
    assert p.ops == recipe.load("batch-invariance-op").probe.ops
    assert p.optional_ops == ("rms_norm_static_fp8_quant", "fused_add_rms_norm_static_fp8_quant",
                              "rms_norm_per_block_quant")
    assert set(p.optional_ops) <= CHECKED and p.dtypes == ("float16", "bfloat16")
    assert 4096 % 128 == 0 and 512 % 128 == 0  # the per-block groups fit every hidden size


def test_the_moe_recipe_swaps_the_moe_extension_and_loads_a_moe_checkpoint() -> None:
    from bisect_tool.probes.op_cases import CHECKED

    r = recipe.load("batch-invariance-moe")
    assert r.artifacts.swap_set == ("vllm/_C_stable_libtorch.abi3.so",
                                    "vllm/_moe_C_stable_libtorch.abi3.so")
    assert r.runtime.weights == "random:models/qwen3-moe-tiny"
    assert "--quantization" in r.runtime.server_args and r.probe.mode == "bs1-vs-bsN"
    assert r.probe.prefix_cache_check and "--no-enable-prefix-caching" not in r.runtime.server_args
    assert {o.split("::")[-1] for o in r.probe.optional_ops} <= CHECKED
    assert all(o.startswith("_moe_C::") for o in r.probe.optional_ops)


MOE_CONFIG = recipe.BUNDLED_DIR / "models" / "qwen3-moe-tiny" / "config.json"


def test_the_moe_checkpoint_config_is_qwen3_moe_shaped() -> None:
    import json

    c = json.loads(MOE_CONFIG.read_text())
    dense = json.loads((MOE_CONFIG.parents[1] / "qwen3-0.6b" / "config.json").read_text())
    assert (c["architectures"], c["model_type"]) == (["Qwen3MoeForCausalLM"], "qwen3_moe")
    assert c["num_experts_per_tok"] <= c["num_experts"] and c["decoder_sparse_step"] == 1
    assert c["mlp_only_layers"] == [] and c["num_hidden_layers"] <= 8  # every layer an MoE
    assert c["num_attention_heads"] % c["num_key_value_heads"] == 0
    # the dense config's tokenizer-facing values: the probe's token ids fit both
    for key in ("vocab_size", "bos_token_id", "eos_token_id", "rms_norm_eps", "head_dim"):
        assert c[key] == dense[key], key
    experts = c["num_hidden_layers"] * c["num_experts"] * 3 * c["hidden_size"] * c[
        "moe_intermediate_size"]
    assert experts < 300_000_000  # small enough to make on the device in seconds


def test_the_moe_checkpoint_config_loads_in_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.from_pretrained(str(MOE_CONFIG.parent))
    assert type(cfg).__name__ == "Qwen3MoeConfig"
    assert (cfg.num_experts, cfg.num_experts_per_tok) == (64, 8)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('name = "x"\n[probe]\nmode = "bs2"\n', "'probe.mode' must be one of"),
        ('name = "x"\n[probe]\nmode = "bs1-vs-bsN"\nbatch_sizes = [100]\n',
         "'probe.batch_sizes' [100] and 'probe.needles' 0 need batches of at most"),
        ('name = "x"\n[probe]\nmode = "bs1-vs-bsN"\nbatch_sizes = [8]\nneedles = 9\n',
         "holding every needle"),
        ('name = "x"\n[probe]\nbatch_sizes = [0]\n', "'probe.batch_sizes' must be >= 1"),
        ('name = "x"\n[probe]\nwarmup_requests = -1\n', "'probe.warmup_requests' must be"),
        ('name = "x"\n[probe.suspects]\nA = 1\n', "'probe.suspects.A' must be a string"),
    ],
)
def test_issue_40_keys_are_checked_at_load(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(RecipeError) as info:
        recipe.load(_write(tmp_path, text))
    assert fragment in str(info.value) and "\n" not in str(info.value)
