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
    false (a log file's raw bytes), its terminal control characters taken out (``clean``)."""
    if controls:
        value = clean(value)
    for secret in secret_values() if secrets is None else secrets:
        if secret in value:
            value = value.replace(secret, REDACTED)
    value = _PRIVATE_KEY.sub(f"-----BEGIN \\1PRIVATE KEY----- {REDACTED}", value)
    value = _TOKEN_SHAPES.sub(REDACTED, value)

    def keep_scheme(m: re.Match[str]) -> str:
        if m.group(2).startswith("$"):  # a reference to a variable, not the credential
            return m.group(0)
        return m.group(1) + REDACTED

    value = _AUTH.sub(keep_scheme, value)
    value = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(3)}", value)

    def pair(m: re.Match[str]) -> str:
        if not is_secret_name(m.group(1)) or m.group(3) == REDACTED or m.group(3).startswith("$"):
            return m.group(0)
        return f"{m.group(1)}{m.group(2)}{REDACTED}"

    def lower_pair(m: re.Match[str]) -> str:
        if m.group(3) == REDACTED or m.group(3).startswith("$"):
            return m.group(0)
        return f"{m.group(1)}{m.group(2)}{REDACTED}"

    value = _PAIR.sub(pair, value)
    return _LOWER_PAIR.sub(lower_pair, value)


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
    """Redacts a byte stream line by line (a server's log), holding a partial last line back so
    a secret split across two reads is still caught."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk
        cut = data.rfind(b"\n") + 1
        self._pending = data[cut:]
        if len(self._pending) > 64 * 1024:  # no newline for long: flush, or memory grows
            cut, self._pending = len(data), b""
        return self._redact(data[:cut])

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return self._redact(rest)

    @staticmethod
    def _redact(data: bytes) -> bytes:
        if not data:
            return data
        return text(data.decode("utf-8", errors="surrogateescape"), controls=False).encode(
            "utf-8", errors="surrogateescape"
        )
