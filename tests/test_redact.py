"""Secrets never reach a file the run writes (issue 14, item 3): every file is grepped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import Libraries
from gitrepos import Repo, linear, run_cli, write_probe

from bisect_tool.errors import NoAnswer, RecipeError, UsageError
from bisect_tool.interfaces import LifetimeSpec, SwapSet
from bisect_tool.recipes import recipe as recipe_mod
from bisect_tool.recipes.recipe import RuntimeSettings
from bisect_tool.redact import REDACTED, is_secret_name
from bisect_tool.runtime import LocalBackend

TOKEN = "hf_" + "Qx7" * 10  # shaped like a Hugging Face token
API_KEY = "k3y-value-" + "z" * 12
RECIPE_TOKEN = "rcp-secret-" + "w" * 14


def written_files(*roots: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for root in roots for p in root.rglob("*") if p.is_file()}


def assert_clean(files: dict[Path, bytes], *secrets: str) -> None:
    assert files
    for path, data in files.items():
        for secret in secrets:
            assert secret.encode() not in data, f"{secret[:6]}... in {path}"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return linear(tmp_path_factory.mktemp("redact") / "repo", 12, tag_every=4)


def test_names_that_look_secret() -> None:
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY",
                 "DB_PASSWORD", "PROXY_AUTH", "GITHUB_PAT", "MY_SECRET"):
        assert is_secret_name(name), name
    for name in ("HF_HOME", "AWS_REGION", "PATH", "PWD", "BISECT_SESSION", "max_tokens",
                 "VLLM_BATCH_INVARIANT", "CUDA_VISIBLE_DEVICES"):
        assert not is_secret_name(name), name


def test_run_probe_that_prints_the_token_leaves_it_in_no_file(
    repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("MY_API_KEY", API_KEY)
    probe = write_probe(tmp_path / "probe.py", flip=9)
    command = f'echo "token $HF_TOKEN"; echo "MY_API_KEY=$MY_API_KEY"; {probe}'
    state = tmp_path / "st"
    code, out, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.3.0", "--run", command,
                             "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    reports = tmp_path / "reports"
    reports.mkdir()
    for fmt in ("md", "json"):
        code, _, err = run_cli("report", "--format", fmt, "-o", str(reports / f"r.{fmt}"),
                               "--repo", str(repo.path), "--state-dir", str(state))
        assert code == 0, err
    code, shown, _ = run_cli("report", "--repo", str(repo.path), "--state-dir", str(state))
    files = written_files(state, reports)
    assert_clean(files, TOKEN, API_KEY)
    assert TOKEN not in shown + out + err and API_KEY not in shown
    journal = (state / "journal.jsonl").read_text()
    assert f"token {REDACTED}" in journal and f"MY_API_KEY={REDACTED}" in journal
    assert f"token {REDACTED}" in (reports / "r.md").read_text()  # the log tail, redacted


def test_recipe_env_secret_is_redacted_from_header_report_and_restored_on_resume(
    repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = tmp_path / "r.toml"
    # no artifact source can serve a commit: the run stops at once, untestable ends
    recipe.write_text(
        'name = "secretive"\n[artifacts]\nsources = ["local"]\nswap_set = ["pkg/_k.so"]\n'
        f'cache_dir = "{tmp_path / "cache"}"\n'
        f'[runtime.env]\nHF_TOKEN = "{RECIPE_TOKEN}"\nPLAIN = "kept-visible"\n'
    )
    state = tmp_path / "st"
    code, _, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.3.0", "--recipe",
                           str(recipe), "--no-controls", "--repo", str(repo.path),
                           "--state-dir", str(state))
    assert code == NoAnswer.exit_code, err
    code, _, err = run_cli("report", "-o", str(tmp_path / "report.md"), "--repo",
                           str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    files = written_files(state, tmp_path / "cache")
    files[tmp_path / "report.md"] = (tmp_path / "report.md").read_bytes()
    assert_clean(files, RECIPE_TOKEN)
    header = (state / "journal.jsonl").read_text().splitlines()[0]
    assert f'"HF_TOKEN": "{REDACTED}"' in header and "kept-visible" in header

    # resume rebuilds the recipe from the journal: the secret comes back from the recipe file
    import json

    stored = json.loads(header)["recipe"]
    assert recipe_mod.from_dict_loose(stored).runtime.env["HF_TOKEN"] == RECIPE_TOKEN
    monkeypatch.setenv("HF_TOKEN", "from-the-environment")
    assert recipe_mod.from_dict_loose(stored).runtime.env["HF_TOKEN"] == "from-the-environment"
    monkeypatch.delenv("HF_TOKEN")
    recipe.unlink()
    with pytest.raises(RecipeError, match="export HF_TOKEN=... and run `bisect resume`"):
        recipe_mod.from_dict_loose(stored)


def test_literal_secret_in_the_run_command_is_refused(repo: Repo, tmp_path: Path) -> None:
    code, _, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.3.0", "--run",
                           f"HF_TOKEN={TOKEN} ./probe.sh", "--repo", str(repo.path),
                           "--state-dir", str(tmp_path / "st"))
    assert code == UsageError.exit_code
    assert "export it and refer to it as $NAME" in err and TOKEN not in err
    assert not (tmp_path / "st" / "journal.jsonl").exists()


def test_server_that_prints_its_token_has_it_redacted_in_its_log(
    tmp_path: Path, pinned_site: Path, kernel_libraries: Libraries
) -> None:
    settings = RuntimeSettings(
        backend="local", python=sys.executable, pinned_package_dir=str(pinned_site),
        server_module="demopkg.server", boot_timeout_s=60.0,
        env={"HF_TOKEN": RECIPE_TOKEN, "TEST_PRINT_VAR": "HF_TOKEN"},
    )
    recipe_mod.from_dict({"name": "x", "runtime": {"env": dict(settings.env)}})  # as a load does
    backend = LocalBackend(settings, session="redact-test", log_dir=tmp_path / "logs",
                           grace_s=5.0, overlay_parent=tmp_path)
    swap = SwapSet(commit="c0ffee" * 7, files={"demopkg/_kernels.so": kernel_libraries.same})
    for mode in ("", "exit"):  # a healthy server, and one that dies before /health
        spec = LifetimeSpec(session="redact-test", lifetime_id=f"c0ffeec0ffee-{mode or 'ok'}",
                            swap=swap, env={"TEST_SERVER_MODE": mode})
        try:
            with backend.lifetime(spec) as server:
                tail = server.log_tail(10)
        except Exception as exc:  # BootFailed carries the log tail into the journal
            tail = str(exc)
        assert RECIPE_TOKEN not in tail and f"loaded with {REDACTED}" in tail, tail
    logs = written_files(tmp_path / "logs")
    assert len(logs) == 2
    assert_clean(logs, RECIPE_TOKEN)
