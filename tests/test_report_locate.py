"""`bisect locate`'s report (issue 32, item 6), read on the GPU's two locate journals
(docs/h200/releases/): cells named by what they hold, the posterior of each explanation, the
controls, the environment, and a next step that makes sense for two adjacent releases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gitrepos import run_cli
from mdtables import rows

from bisect_tool.range import Candidate
from bisect_tool.recipes import recipe as recipe_mod
from bisect_tool.run import locate as locate_mod
from bisect_tool.strategy.matrix import Explanation, Finding

RELEASES = Path(__file__).resolve().parent.parent / "docs" / "h200" / "releases"
DECIDED = RELEASES / "locate-fa3-pinned.jsonl"
UNDECIDED = RELEASES / "locate.jsonl"


def report_of(path: Path) -> str:
    code, out, err = run_cli("report", "--journal", str(path))
    assert code == 0, err
    return out


def table(md: str, title: str) -> list[list[str]]:
    return rows(md[md.index(f"### {title}"):])


def test_a_decided_locate_names_its_cells_and_the_commit_level_bisect_next() -> None:
    md = report_of(DECIDED)
    assert md.startswith("## Locate: the compiled side carries the change (99.5%)\n")
    first = md.split("\n\n")[1]
    assert first == ("**The compiled side carries the change** — **99.5%**. v0.26.0 Python + "
                     "v0.27.0 `_C_stable_libtorch.abi3.so` was clean in 3 of 3; v0.27.0 Python "
                     "+ v0.26.0 `_C_stable_libtorch.abi3.so` diverged in 2 of 2 lifetimes.")
    # two adjacent releases: the commits between them, in a clone; not --releases (nothing
    # between them to search), the recipe by the file the Reproduce block describes
    assert ("- Next: bisect the commits between v0.26.0 and v0.27.0, with the Python side "
            "pinned, in a vLLM clone: `bisect start --good v0.27.0 --bad v0.26.0 --recipe "
            "batch-invariance-h200-gated.toml`") in md
    assert "--releases --good v0.27.0" not in md
    cells = {r[0]: r[1:] for r in table(md, "Cells")}
    assert cells == {
        "v0.26.0 as released": ["v0.26.0", "v0.26.0", "2", "2", "-"],
        "v0.27.0 Python + v0.26.0 _C_stable_libtorch.abi3.so": ["v0.27.0", "v0.26.0", "2", "2",
                                                                "-"],
        "v0.26.0 Python + v0.27.0 _C_stable_libtorch.abi3.so": ["v0.26.0", "v0.27.0", "3", "0",
                                                                "-"],
        "v0.27.0 as released": ["v0.27.0", "v0.27.0", "2", "0", "-"],
    }
    # what the run did not record is said, not guessed (0.27.0's side held 0.26.0's FA3)
    assert "The Python sides came from folders" in md
    posterior = {r[0]: r[1] for r in table(md, "How sure")}
    assert posterior["the compiled side carries the change: bisect with the swap set, the "
                     "Python side pinned"] == "99.5%"
    assert "Not run (`--no-controls`)" in md
    assert "### Environment" in md and "Differences from the setup reported in vLLM" in md
    assert len(table(md, "Evidence")) == 9
    assert md.count("<details>") == 1 and "/tmp/" not in md


def test_an_undecided_locate_says_which_cells_could_not_run_and_why_in_one_line() -> None:
    md = report_of(UNDECIDED)
    assert md.startswith("## Locate: not decided (the compiled side carries the change: "
                         "70.8%)\n")
    assert ("- Next: not decided: v0.27.0 Python + v0.26.0 `_C_stable_libtorch.abi3.so` and "
            "v0.27.0 as released could not run here") in md
    cells = {r[0]: r for r in table(md, "Cells")}
    assert cells["v0.27.0 as released"][5] == (
        "server exited with code 1 before /health: ValidationError: 1 validation error for "
        "ModelConfig: Value error, Model architectures ['Qwen3ForCausalLM'] failed to be "
        "inspected. Please check the logs for more details.")
    assert "Traceback" not in md and "pid=" not in md
    assert "(the whole log: `logs/locate-good-py-good-c-0.log` in the state dir)" in md


def _new_run(tmp_path: Path, **header: Any) -> Path:
    """The decided journal as today's locate writes it: the environment with each Python
    side's compiled files (FA3 the same file in both), the controls on the good end."""
    lines = [json.loads(x) for x in DECIDED.read_text().splitlines()]
    lines[0].update(header)
    fa3 = "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"
    env = {"type": "environment", "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130",
           "pinned_version": "0.26.0", "missing_extensions": [],
           "sides": {"good": {"files": {fa3: "aa" * 32, "vllm/_moe_C.abi3.so": "bb" * 32}},
                     "bad": {"files": {fa3: "aa" * 32, "vllm/_moe_C.abi3.so": "cc" * 32}}}}
    detail = {"distinct_outputs": 5, "repeats": 5, "differing_pairs": [[0, 1]] * 10,
              "max_coresidency": 44, "lifetime_id": "control-vllm-0.27.0-0"}
    controls = {"type": "controls", "commit": "vllm-0.27.0", "ok": True, "problem": "",
                "attempts": 1,
                "positive": {"verdict": "divergent", "message": "", "detail": detail},
                "negative": {"verdict": "clean", "message": "", "detail": {
                    **detail, "distinct_outputs": 1, "differing_pairs": [],
                    "max_coresidency": 1}}}
    lines[1:1] = [env, controls]
    path = tmp_path / "locate.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    return path


def test_todays_locate_names_what_every_cell_shared_and_where_the_controls_ran(
    tmp_path: Path,
) -> None:
    md = report_of(_new_run(tmp_path))
    assert ("The same in every cell: PyTorch 2.11.0+cu130, "
            "`vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so` (one file in both Python sides).") in md
    assert "_moe_C" not in md[: md.index("### How sure")]  # different files are not "the same"
    assert "The Python sides came from folders" not in md
    assert "Run on `v0.27.0` as released, booted with `VLLM_BATCH_INVARIANT=0`:" in md
    assert "- Positive (concurrent, batch invariance off): **DIVERGENT**, 5 distinct outputs" in md


def test_releases_between_the_ends_are_bisected_first(tmp_path: Path) -> None:
    md = report_of(_new_run(tmp_path, releases_between=3))
    assert ("- Next: bisect the 3 releases between v0.26.0 and v0.27.0 with the Python side "
            "pinned, then the commits between the two it names: `bisect start --releases "
            "--good v0.27.0 --bad v0.26.0 --recipe batch-invariance-h200-gated.toml`") in md


def test_the_runs_own_next_step_is_the_commit_bisect_for_adjacent_releases() -> None:
    """What `bisect locate` prints at its end: the same rule as its report."""
    recipe = recipe_mod.load("batch-invariance")
    good = Candidate("vllm-0.27.0", "vllm 0.27.0", None, ("v0.27.0",))
    bad = Candidate("vllm-0.26.0", "vllm 0.26.0", None, ("v0.26.0",))
    request = locate_mod.LocateRequest("0.27.0", "0.26.0", recipe, Path("state"),
                                       releases=object())
    finding = Finding(Explanation.COMPILED, 0.996, {Explanation.COMPILED: 0.996}, True, ())
    adjacent = locate_mod.next_step(finding, request, good, bad, {}, 0)
    assert adjacent.endswith("Next, the commits between them in a vLLM clone: bisect start "
                             "--good v0.27.0 --bad v0.26.0 --recipe batch-invariance")
    apart = locate_mod.next_step(finding, request, good, bad, {}, 2)
    assert apart.endswith("Next: the 2 releases between them, then the commits between the two "
                          "it names: bisect start --releases --good v0.27.0 --bad v0.26.0 "
                          "--recipe batch-invariance")
