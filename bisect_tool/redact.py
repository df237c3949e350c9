"""Secrets never reach a file the tool writes: the journal, the report, lifetime logs.

The report is made to be pasted into a public issue, and the journal travels with it, so the
values of variables whose names look secret (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``,
``OPENAI_API_KEY``, ``*_PASSWORD``, ``*_AUTH``...) are replaced by ``[redacted]`` before
anything is written:

- in mappings (``[runtime.env]``, a probe's detail), by the variable's name;
- in text (log tails, server logs, messages, the command line), every value such a variable has
  in the tool's environment or in a recipe's env, ``NAME=value`` pairs with a secret name, the
  credential of an ``Authorization:``/``Bearer`` header, the password of a URL
  (``https://user:pw@host``), lower-case credential keys (``aws_secret_access_key = ...``,
  ``password: ...``), private key blocks, and strings shaped like well-known tokens (OpenAI-style
  ``sk-...``, Hugging Face ``hf_...``, GitHub ``ghp_...``/``github_pat_...``, AWS key ids
  ``AKIA...``/``ASIA...``, Slack ``xox?-...``, Google ``AIza...``).

Names count only when written like environment variables (upper case): recipe keys such as
``max_tokens`` are not secrets. ``HF_*``/``AWS_*`` settings that name a place or a switch
(``HF_HOME``, ``AWS_REGION``...) are not credentials and are kept, so paths in logs stay readable.

Terminal control characters are taken out of every string that reaches the journal or the report
(``clean``): a probe or a server can print an escape sequence that retitles the terminal (OSC),
moves the cursor or hides text (CSI), rings the bell or embeds NUL, and the report quotes what it
printed. Only ``\n`` and ``\t`` are kept (``\r`` becomes ``\n``); Unicode bidi overrides go too,
so a pasted report reads as it is. The lifetimes' own log files keep the bytes as printed
(``LineRedactor`` only redacts): they are the raw record.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[redacted]"

_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_SECRET_PARTS = {"TOKEN", "TOKENS", "KEY", "KEYS", "SECRET", "SECRETS", "PASSWORD", "PASSWD",
                 "PASS", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "AUTH", "COOKIE", "PAT"}
_SECRET_ENDINGS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIALS", "AUTH")
# A part of the name that says it is a token or a secret although run together with another word
# (MYTOKEN_FILE, APIKEY_VALUE, CLIENTSECRET): it ends so. Not "...KEY" alone: MONKEY, TURKEY.
_SECRET_PART_ENDINGS = ("TOKEN", "TOKENS", "SECRET", "SECRETS", "APIKEY", "ACCESSKEY",
                        "SECRETKEY", "PRIVATEKEY", "PASSWORD")
_SECRET_PREFIXES = ("HF_", "HUGGING_FACE_", "HUGGINGFACE_", "AWS_")
_PLACE_OR_SWITCH = ("_HOME", "_CACHE", "_DIR", "_PATH", "_OFFLINE", "_ENDPOINT", "_REGION",
                    "_PROFILE", "_VERBOSITY", "_TRANSFER", "_DISABLE_TELEMETRY")
# A value this short is not worth scrubbing from free text (and would wipe out unrelated text).
_MIN_VALUE = 6
_TOKEN_SHAPES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}|xox[baprs]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35}"
    # OpenAI/Anthropic-style keys (sk-..., sk-proj-..., sk-ant-...): with a digit, so that a
    # hyphenated phrase such as "sk-learn-compatible-estimators" is not one
    r"|sk-(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{20,})(?![A-Za-z0-9_-])"
)
_PAIR = re.compile(r"\b([A-Z][A-Z0-9_]*)(=|:\s*|\"\s*:\s*\")([^\s\"',;]+)")
# "Authorization: Bearer X", "authorization=Basic X", "-H 'Authorization: token X'", and a bare
# "Bearer X": the scheme is kept, the credential goes.
_AUTH = re.compile(
    r"(?i)(\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?(?:(?:bearer|basic|token|digest)\s+)?"
    r"|\bbearer\s+)((?!(?:bearer|basic|token|digest)\b)[$A-Za-z0-9._~+/=:-]{6,})"
)
# Credential keys as config files and tools spell them, in lower case (~/.aws/credentials,
# .netrc-like dumps, JSON): a recipe key such as max_tokens is none of these.
_LOWER_PAIR = re.compile(
    r"(?i)\b(aws_secret_access_key|aws_session_token|secret_access_key|api[_-]?key|access_token"
    r"|auth_token|refresh_token|client_secret|password|passwd)([\"']?\s*[:=]\s*[\"']?)"
    r"([^\s\"',;]+)"
)
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]+:)([^/\s@]+)(@)")
_PRIVATE_KEY = re.compile(
    r"-----BEGIN ([A-Z ]*)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|\Z)", re.S
)
# ESC sequences first (OSC ... BEL/ST, CSI ... final byte, then any other ESC + one byte), then
# the C0 and C1 controls but \t and \n, DEL, and Unicode bidi overrides.
_OSC = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?")
_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]?")
_ESC = re.compile(r"\x1b.?", re.S)
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

_extra: set[str] = set()
_extra_lock = threading.Lock()


def is_secret_name(name: str) -> bool:
    if not _ENV_NAME.match(name) or name == "PWD":
        return False
    if name.startswith(_SECRET_PREFIXES):
        return not name.endswith(_PLACE_OR_SWITCH)
    parts = name.split("_")
    return (any(p in _SECRET_PARTS or p.endswith(_SECRET_PART_ENDINGS) for p in parts)
            or name.endswith(_SECRET_ENDINGS))


def remember(env: Mapping[str, str]) -> None:
    """Values of secret-named variables the tool passes to children (a recipe's env): they are
    not in our own environment, but a child may print them."""
    with _extra_lock:
        _extra.update(
            v for k, v in env.items() if is_secret_name(k) and isinstance(v, str)
            and len(v) >= _MIN_VALUE and v != REDACTED
        )


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    found = {v for k, v in env.items() if is_secret_name(k) and len(v) >= _MIN_VALUE}
    with _extra_lock:
        found |= _extra
    return sorted(found, key=len, reverse=True)  # longest first: no half-replaced value


def text(value: str, secrets: Iterable[str] | None = None, *, controls: bool = True) -> str:
    """``value`` with every secret replaced by ``[redacted]`` and, unless ``controls`` is
    false (a log file's raw bytes), its terminal control characters taken out (``clean``).

    Each shape is looked for only where the words it needs are in ``value`` (``_Hints``):
    that test is exact, and takes a chatty probe's log from 4 MB/s to the speed of the pipe
    (issue 38: a probe printing 100 MB ran into --run-timeout 15 although it took 0.08 s)."""
    if controls:
        value = clean(value)
    for secret in secret_values() if secrets is None else secrets:
        if secret in value:
            value = value.replace(secret, REDACTED)
    return _redact_shapes(value)


def _redact_shapes(value: str) -> str:
    """``value`` with every secret-shaped part replaced (keys, tokens, credentials in an
    Authorization header or a URL, values of secret-named settings)."""
    hints = _Hints(value)
    if hints.private_key:
        value = _PRIVATE_KEY.sub(f"-----BEGIN \\1PRIVATE KEY----- {REDACTED}", value)
    if hints.token:
        value = _TOKEN_SHAPES.sub(REDACTED, value)
    if hints.auth:
        value = _AUTH.sub(_keep_scheme, value)
    if hints.url:
        value = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(3)}", value)
    if hints.pair:
        value = _PAIR.sub(_pair, value)
    if hints.lower_pair:
        value = _LOWER_PAIR.sub(_lower_pair, value)
    return value


def _keep_scheme(m: re.Match[str]) -> str:
    if m.group(2).startswith("$"):  # a reference to a variable, not the credential
        return m.group(0)
    return m.group(1) + REDACTED


def _pair(m: re.Match[str]) -> str:
    if not is_secret_name(m.group(1)) or m.group(3) == REDACTED or m.group(3).startswith("$"):
        return m.group(0)
    return f"{m.group(1)}{m.group(2)}{REDACTED}"


def _lower_pair(m: re.Match[str]) -> str:
    if m.group(3) == REDACTED or m.group(3).startswith("$"):
        return m.group(0)
    return f"{m.group(1)}{m.group(2)}{REDACTED}"


# The words each shape cannot match without, tested with ``in`` (a fast scan) before its
# regular expression runs (slow: 2-6 ms per 64 KiB each), grouped by a character each word of
# the group holds, which is looked for first (a ``memchr``, at memory speed: most output has no
# ``_`` or ``-``). tests/test_secrets.py checks that the shapes find nothing more without them.
_PRIVATE_KEY_WORDS = ("PRIVATE KEY-----",)  # "-"
_TOKEN_WORDS = {"_": ("hf_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
                "-": ("sk-", "xoxb-", "xoxa-", "xoxp-", "xoxr-", "xoxs-"),
                "A": ("AKIA", "ASIA", "AIza")}
# every name ``is_secret_name`` accepts holds one of these
_SECRET_NAME_WORDS = ("TOKEN", "KEY", "SECRET", "PASS", "CREDENTIAL", "AUTH", "COOKIE", "PAT",
                      "HF_", "HUGGING", "AWS_")
# the case-insensitive shapes, in lower case
_AUTH_WORDS = {"a": ("authorization", "bearer")}
_LOWER_PAIR_WORDS = {"_": ("secret_access_key", "session_token", "api_key", "access_token",
                           "auth_token", "refresh_token", "client_secret"),
                     "-": ("api-key",),
                     "a": ("apikey", "password", "passwd")}
# Characters a case-insensitive expression matches to an ASCII letter although ``lower()``
# does not make them that letter (dotless i, long s, Kelvin sign...): where one is present the
# case-insensitive shapes run without the test. tests/test_secrets.py derives the set again.
_FOLDS_TO_ASCII = "\u0130\u0131\u017f\u212a"


class _Hints:
    """Which shapes can match ``value`` at all."""

    def __init__(self, value: str) -> None:
        self.private_key = "-" in value and _any_in(_PRIVATE_KEY_WORDS, value)
        self.token = _gated(_TOKEN_WORDS, value)
        self.url = "://" in value and "@" in value
        self.pair = ("=" in value or ":" in value) and _any_in(_SECRET_NAME_WORDS, value)
        if value.isascii() or not any(c in value for c in _FOLDS_TO_ASCII):
            low = value.lower()
            self.auth = _gated(_AUTH_WORDS, low)
            self.lower_pair = _gated(_LOWER_PAIR_WORDS, low)
        else:
            self.auth = self.lower_pair = True

    def shapes(self) -> list[re.Pattern[str]]:
        return [shape for shape, wanted in (
            (_PRIVATE_KEY, self.private_key), (_TOKEN_SHAPES, self.token), (_AUTH, self.auth),
            (_URL_PASSWORD, self.url), (_PAIR, self.pair), (_LOWER_PAIR, self.lower_pair),
        ) if wanted]


def _gated(groups: Mapping[str, Iterable[str]], value: str) -> bool:
    return any(gate in value and _any_in(words, value) for gate, words in groups.items())


def _any_in(words: Iterable[str], value: str) -> bool:
    return any(word in value for word in words)


def spans(value: str, secrets: Iterable[str]) -> list[tuple[int, int]]:
    """Where in ``value`` something ``text`` would redact lies (start, end): a cut inside one
    of these would hand each half to ``text`` alone, and neither half is a secret."""
    found: list[tuple[int, int]] = []
    for secret in secrets:
        at = value.find(secret)
        while at >= 0:
            found.append((at, at + len(secret)))
            at = value.find(secret, at + 1)
    for shape in _Hints(value).shapes():
        found += [m.span() for m in shape.finditer(value)]
    return found


def clean(value: str) -> str:
    """``value`` without terminal control characters: ESC sequences (OSC titles, CSI cursor and
    colour codes), NUL, BEL and the other C0/C1 controls, DEL and Unicode bidi overrides; ``\n``
    and ``\t`` are kept and ``\r`` (a progress line redrawn) becomes ``\n``."""
    if value.isprintable():  # the common case: nothing to take out
        return value
    value = value.replace("\r\n", "\n").replace("\r", "\n")
    value = _OSC.sub("", value)
    value = _CSI.sub("", value)
    value = _ESC.sub("", value)
    return _CONTROLS.sub("", value)


def value(obj: Any, secrets: Iterable[str] | None = None) -> Any:
    """A copy of a JSON-like value (dicts, lists, strings...) with its secrets redacted and its
    strings (keys too) cleaned of terminal control characters."""
    found = list(secret_values() if secrets is None else secrets)
    return _walk(obj, found)


def _walk(obj: Any, secrets: list[str]) -> Any:
    if isinstance(obj, str):
        return text(obj, secrets)
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            key = clean(k) if isinstance(k, str) else k
            if isinstance(k, str) and is_secret_name(k) and isinstance(v, str) and v:
                out[key] = REDACTED
            else:
                out[key] = _walk(v, secrets)
        return out
    if isinstance(obj, list | tuple):
        return [_walk(v, secrets) for v in obj]
    return obj


def literal_secret(command: str) -> str | None:
    """The name (or kind) of a secret written literally in ``command``, if any: such a command
    cannot be journaled (resume runs the journaled command) without writing the secret."""
    for m in _PAIR.finditer(command):
        if is_secret_name(m.group(1)) and not m.group(3).startswith("$"):
            return m.group(1)
    if _TOKEN_SHAPES.search(command) or _PRIVATE_KEY.search(command):
        return "a token"
    shapes = ((_AUTH, 2, "an Authorization credential"), (_URL_PASSWORD, 2, "a URL password"),
              (_LOWER_PAIR, 3, "a credential"))
    for shape, group, what in shapes:
        for found in shape.finditer(command):
            if not found.group(group).startswith("$") and found.group(group) != REDACTED:
                return what
    for secret in secret_values():
        if secret in command:
            return "the value of a secret variable"
    return None


class LineRedactor:
    """Redacts a byte stream line by line (a server's log, a probe's output), holding a partial
    last line back so a secret split across two reads is still caught.

    A line longer than ``LONG_LINE`` is flushed in pieces, or memory would grow without bound;
    each piece ends where nothing ``text`` redacts is cut in two (``spans``), ``OVERLAP``
    characters before the end of what came, so a secret that straddles the flush point is
    seen whole in the next piece (issue 38: it reached the lifetime log whole). A private key
    block is held until its END line (or ``LONG_LINE``), for the same reason."""

    LONG_LINE = 64 * 1024
    OVERLAP = 4 * 1024

    def __init__(self) -> None:
        self._pending = b""
        # the secrets as at the start of the stream: looked up once, not once per read
        self._secrets = secret_values()

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk
        cut = data.rfind(b"\n") + 1
        if b"PRIVATE KEY-----" in data:
            cut = self._before_open_key(data, cut)
        if len(data) - cut > self.LONG_LINE:  # no newline for long: flush most of it
            cut = self._safe_cut(data)
        self._pending = data[cut:]
        return self._redact(data[:cut])

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return self._redact(rest)

    def _before_open_key(self, data: bytes, cut: int) -> int:
        """``cut``, or the start of a private key block that begins before it and has not
        ended in ``data`` (it is redacted whole, once its END line has come)."""
        begin = data.rfind(b"-----BEGIN ", 0, cut)
        opened = begin >= 0 and b"PRIVATE KEY-----" in data[begin:begin + 80]
        if opened and b"-----END " not in data[begin + 11:]:
            return min(cut, begin)
        return cut

    def _safe_cut(self, data: bytes) -> int:
        """Where to end a piece of a long line: ``OVERLAP`` before the end of ``data``, moved
        back to the start of any redactable span across it; in bytes."""
        value = data.decode("utf-8", errors="surrogateescape")
        cut = max(0, len(value) - self.OVERLAP)
        found = spans(value, self._secrets)
        moved = True
        while moved:
            moved = False
            for start, end in found:
                if start < cut < end:
                    cut, moved = start, True
        if cut == 0:  # one span over all of it (a key block without an END): flush it whole
            return len(data)
        return len(value[:cut].encode("utf-8", errors="surrogateescape"))

    def _redact(self, data: bytes) -> bytes:
        if not data:
            return data
        return text(data.decode("utf-8", errors="surrogateescape"), self._secrets,
                    controls=False).encode("utf-8", errors="surrogateescape")
