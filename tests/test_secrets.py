"""Issue 30: the pasted report and the journal hold no secret of any common shape, and no
terminal control sequence a probe printed. Real strings go through a real run: a ``--run`` probe
prints them, and every file the run and the report wrote is read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gitrepos import Repo, linear, run_cli, write_probe
from tier import examples

from bisect_tool import redact
from bisect_tool.errors import UsageError
from bisect_tool.redact import REDACTED, LineRedactor

# Shaped like the real thing (made up; the checksums of real keys are not checked by anyone).
OPENAI = "sk-proj-" + "Tq3vX9" * 8
ANTHROPIC = "sk-ant-api03-" + "Zk4Lm8" * 7
BEARER = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.Q1w2E3r4T5y6U7i8O9p0"
GITHUB = "ghp_" + "R7tY2uI9oP" * 3 + "aSdFgH"
GITHUB_PAT = "github_pat_11ABCDEFG0" + "_x8Yz" * 12
HF = "hf_" + "MnBvCxZ4" * 4
AWS_ID = "AKIA" + "Q2W3E4R5T6Y7U8I9"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY"
ENV_TOKEN = "opaque-value-" + "n0tAshape" * 2  # no known shape: caught by the variable's name
ENV_KEY = "another-opaque-" + "v4lue" * 3
ENV_SECRET = "third-opaque-" + "s3cr" * 4
URL_PASSWORD = "pa55w0rd-in-url"

SECRETS = (OPENAI, ANTHROPIC, BEARER, GITHUB, GITHUB_PAT, HF, AWS_ID, AWS_SECRET, ENV_TOKEN,
           ENV_KEY, ENV_SECRET, URL_PASSWORD)

# What a probe might print: headers, a credentials file, an index URL, a config dump.
PRINTED = [
    f"openai key {OPENAI}",
    f"anthropic {ANTHROPIC}",
    f"curl -H 'Authorization: Bearer {BEARER}' https://api.example",
    f"token {GITHUB} and {GITHUB_PAT}",
    f"hub token {HF}",
    f"aws_access_key_id = {AWS_ID}",
    f"aws_secret_access_key = {AWS_SECRET}",
    f"Looking in indexes: https://deploy:{URL_PASSWORD}@pypi.internal/simple",
    "service token $MYSERVICE_TOKEN, key $PAYMENTS_APIKEY, secret $CLIENTSECRET_VALUE",
]
# Terminal control sequences: an OSC title, CSI colour and cursor codes, BEL, NUL, a bidi
# override, a carriage return redrawing a line.
CONTROLS = ("\x1b]0;owned-title\x07\x1b[31mred\x1b[0m \x1b[2Jcleared\x07bell\x00nul "
            "\u202eevil\rredraw")
CONTROL_CHARS = ("\x1b", "\x07", "\x00", "\u202e", "\r")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return linear(tmp_path_factory.mktemp("secrets") / "repo", 8, tag_every=4)


def files_under(*roots: Path) -> dict[Path, str]:
    return {p: p.read_bytes().decode("utf-8", "replace") for root in roots
            for p in root.rglob("*") if p.is_file()}


def test_every_common_token_shape_and_secret_variable_stays_out_of_journal_and_report(
    repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MYSERVICE_TOKEN", ENV_TOKEN)
    monkeypatch.setenv("PAYMENTS_APIKEY", ENV_KEY)
    monkeypatch.setenv("CLIENTSECRET_VALUE", ENV_SECRET)
    printer = tmp_path / "print.py"
    printer.write_text(
        "import sys\n"
        f"lines = {PRINTED!r}\n"
        "import os\n"
        "for line in lines:\n"
        "    print(os.path.expandvars(line))\n"
        f"sys.stdout.write({CONTROLS!r} + '\\n')\n"
    )
    probe = write_probe(tmp_path / "probe.py", flip=5)
    command = f"python3 {printer} >&2; {probe}"
    state = tmp_path / "st"
    code, out, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.2.0", "--run", command,
                             "--repo", str(repo.path), "--state-dir", str(state), "-q")
    assert code == 0, err
    reports = tmp_path / "reports"
    reports.mkdir()
    for fmt in ("md", "json"):
        code, _, err = run_cli("report", "--format", fmt, "-o", str(reports / f"r.{fmt}"),
                               "--repo", str(repo.path), "--state-dir", str(state))
        assert code == 0, err
    code, shown, _ = run_cli("report", "--repo", str(repo.path), "--state-dir", str(state))
    written = files_under(state, reports)
    assert written
    for path, data in [*written.items(), (Path("<stdout>"), shown + out)]:
        for secret in SECRETS:
            assert secret not in data, f"{secret[:10]}... in {path}"
        if path.parent.name == "logs":
            continue  # a lifetime's own log keeps its bytes as printed (redacted, not cleaned)
        for char in CONTROL_CHARS:
            assert char not in data, f"{char!r} in {path}"
    journal = (state / "journal.jsonl").read_text()
    for line in journal.splitlines():  # every line still JSON, every string clean
        json.loads(line)
    # what was printed is still readable, the secrets in their place marked
    assert f"openai key {REDACTED}" in journal
    assert f"Authorization: Bearer {REDACTED}" in journal
    assert f"aws_secret_access_key = {REDACTED}" in journal
    assert f"https://deploy:{REDACTED}@pypi.internal/simple" in journal
    assert f"service token {REDACTED}, key {REDACTED}, secret {REDACTED}" in journal
    # the text around the controls is kept; the OSC title's text goes with its sequence
    assert "red clearedbellnul evil\\nredraw" in journal and "owned-title" not in journal
    report = (reports / "r.md").read_text()
    assert f"hub token {REDACTED}" in report


def test_a_literal_credential_in_the_run_command_is_refused(repo: Repo, tmp_path: Path) -> None:
    for command in (f"curl -H 'Authorization: Bearer {BEARER}' http://127.0.0.1:1",
                    f"OPENAI_API_KEY={OPENAI} ./probe.sh", f"./probe.sh {AWS_ID}",
                    f"pip download --index-url https://u:{URL_PASSWORD}@127.0.0.1/simple x"):
        code, _, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.2.0", "--run", command,
                               "--repo", str(repo.path), "--state-dir", str(tmp_path / "st"))
        assert code == UsageError.exit_code, (command, err)
        assert "export it and refer to it as $NAME" in err
        assert not any(s in err for s in SECRETS)
    # a reference to a variable is the way to pass one
    assert redact.literal_secret("curl -H \"Authorization: Bearer $API_TOKEN\" x") is None


def test_a_servers_log_keeps_its_bytes_but_not_its_secrets() -> None:
    lines = [*PRINTED, f"dump OPENAI_API_KEY={OPENAI}", CONTROLS]
    data = ("\n".join(lines) + "\n").encode()
    redactor = LineRedactor()
    # fed in pieces that cut tokens in two: the partial line is held back
    out = b"".join(redactor.feed(data[i:i + 7]) for i in range(0, len(data), 7))
    out += redactor.flush()
    text = out.decode()
    for secret in (OPENAI, ANTHROPIC, BEARER, GITHUB, GITHUB_PAT, HF, AWS_ID, AWS_SECRET,
                   URL_PASSWORD):
        assert secret not in text
    assert "\x1b[31mred" in text  # the raw log keeps the escape codes; the journal does not


@pytest.mark.parametrize("kept", [
    "max_tokens = 24", "prompt_tokens: 16", "sk-learn-compatible-estimators-and-more",
    "the bearer of bad news", "TOKENIZERS_PARALLELISM=false", "MONKEY_PATCH=yes-please-1",
    "https://pypi.org/simple/vllm/", "KEYBOARD_LAYOUT=us-intl-alt",
])
def test_ordinary_text_is_left_alone(kept: str) -> None:
    assert redact.text(kept, secrets=()) == kept


# ---- issue 38: a long line, a split secret, and the speed of the words' test --------------------

FLUSH_AT = 64 * 1024  # a line with no newline is flushed in pieces of about this much


@pytest.mark.parametrize("secret", [HF, OPENAI, f"Authorization: Bearer {BEARER}",
                                    f"aws_secret_access_key = {AWS_SECRET}"])
@pytest.mark.parametrize("offset", [1, 5, 13])
def test_a_secret_split_at_the_flush_point_of_a_long_line_never_reaches_the_log_whole(
    secret: str, offset: int
) -> None:
    """A line with no newline is flushed every 64 KiB; the read that pushes it over ends
    ``offset`` characters into the secret, so the flush cut it in two and neither half was
    one (issue 38: it reached the lifetime log whole)."""
    redactor = LineRedactor()
    head = ("x " * 20000).encode()  # 40 KB, no newline
    data = head + b"y" * (FLUSH_AT - len(head)) + b" " + secret.encode()
    cut = FLUSH_AT + 1 + offset
    out = redactor.feed(head) + redactor.feed(data[len(head):cut]) + redactor.feed(data[cut:])
    out += redactor.feed(b" and more\n") + redactor.flush()
    assert out.count(b"\n") == 1 and len(out) > FLUSH_AT
    text = out.decode()
    assert secret.split()[-1] not in text and REDACTED in text


def test_a_private_key_over_several_reads_is_redacted_whole() -> None:
    body = "\n".join("MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" + str(i) * 32 for i in range(6))
    block = f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\nafter\n".encode()
    redactor = LineRedactor()
    out = b"".join(redactor.feed(block[i:i + 40]) for i in range(0, len(block), 40))
    out += redactor.flush()
    assert b"MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" not in out and b"after\n" in out


def _all_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    class Every:
        private_key = token = url = pair = auth = lower_pair = True

        def __init__(self, value: str) -> None:
            pass

    monkeypatch.setattr(redact, "_Hints", Every)


FRAGMENTS = [
    "x", " ", "\n", "=", ": ", '"', "'", ",", "_", "-", "@", "://", "A", "a", "$", "HF_TOKEN",
    "MY_API_KEY", "CLIENTSECRET", "GITHUB_PAT", "PASSWORD", "AWS_", "HUGGING_FACE_TOKEN", "KEY",
    "TOKEN", "COOKIE", "PAT", "CREDENTIALS", "AUTH", "Authorization", "bearer ", "Bearer ",
    "Proxy-Authorization: ", "token ", "basic ", "password", "PassWd", "api-key", "apikey",
    "API_KEY", "access_token", "auth_token", "refresh_token", "client_secret", "session_token",
    "secret_access_key", "aws_secret_access_key", "hf_", "Qx7Qx7Qx7Qx7Qx7Qx7", "sk-", "9",
    "ghp_", "gho_", "github_pat_", "AKIA", "ASIA", "Q2W3E4R5T6Y7U8I9", "xoxb-", "AIza",
    "https://u", "http://user:", "pw", "@host/x", "-----BEGIN RSA PRIVATE KEY-----",
    "-----END RSA PRIVATE KEY-----", "\u0131", "\u017f", "\u212a", "\u0130", "pa\u017f\u017fword",
    "ap\u0131_key", "beare\u0280", "é", "█",
]


def test_looking_for_the_words_first_redacts_exactly_what_every_shape_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``text`` runs a shape only where the words it needs are present: that test is exact."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=examples(3000, 300), deadline=None, derandomize=True)
    @given(st.lists(st.sampled_from(FRAGMENTS), max_size=30).map("".join))
    def same(value: str) -> None:
        fast = redact.text(value, secrets=())
        with monkeypatch.context() as m:
            _all_shapes(m)
            assert fast == redact.text(value, secrets=()), value

    same()


def test_the_characters_that_fold_to_ascii_are_all_known() -> None:
    """A case-insensitive shape matches an ASCII letter to a few other characters; where one
    of them is present the words are not looked for in lower case (they would be missed)."""
    import re

    letter = re.compile("(?i)[a-z]")
    folds = {chr(cp) for cp in range(128, 0x110000) if letter.fullmatch(chr(cp))
             and not (chr(cp).lower().isascii() and len(chr(cp).lower()) == 1)}
    assert folds <= set(redact._FOLDS_TO_ASCII)
