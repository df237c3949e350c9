"""Secrets never reach a file the tool writes: the journal, the report, lifetime logs.

The report is made to be pasted into a public issue, and the journal travels with it, so the
values of variables whose names look secret (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``,
``*_PASSWORD``, ``*_AUTH``...) are replaced by ``[redacted]`` before anything is written:

- in mappings (``[runtime.env]``, a probe's detail), by the variable's name;
- in text (log tails, server logs, messages, the command line), every value such a variable has
  in the tool's environment or in a recipe's env, ``NAME=value`` pairs with a secret name, and
  strings shaped like well-known tokens (Hugging Face, GitHub, AWS key ids).

Names count only when written like environment variables (upper case): recipe keys such as
``max_tokens`` are not secrets. ``HF_*``/``AWS_*`` settings that name a place or a switch
(``HF_HOME``, ``AWS_REGION``...) are not credentials and are kept, so paths in logs stay readable.
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
_SECRET_PREFIXES = ("HF_", "HUGGING_FACE_", "HUGGINGFACE_", "AWS_")
_PLACE_OR_SWITCH = ("_HOME", "_CACHE", "_DIR", "_PATH", "_OFFLINE", "_ENDPOINT", "_REGION",
                    "_PROFILE", "_VERBOSITY", "_TRANSFER", "_DISABLE_TELEMETRY")
# A value this short is not worth scrubbing from free text (and would wipe out unrelated text).
_MIN_VALUE = 6
_TOKEN_SHAPES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|AKIA[0-9A-Z]{16}|xox[baprs]-[A-Za-z0-9-]{10,})\b"
)
_PAIR = re.compile(r"\b([A-Z][A-Z0-9_]*)(=|:\s*|\"\s*:\s*\")([^\s\"',;]+)")

_extra: set[str] = set()
_extra_lock = threading.Lock()


def is_secret_name(name: str) -> bool:
    if not _ENV_NAME.match(name) or name == "PWD":
        return False
    if name.startswith(_SECRET_PREFIXES):
        return not name.endswith(_PLACE_OR_SWITCH)
    parts = name.split("_")
    return any(p in _SECRET_PARTS for p in parts) or name.endswith(_SECRET_ENDINGS)


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


def text(value: str, secrets: Iterable[str] | None = None) -> str:
    """``value`` with every secret replaced by ``[redacted]``."""
    for secret in secret_values() if secrets is None else secrets:
        if secret in value:
            value = value.replace(secret, REDACTED)
    value = _TOKEN_SHAPES.sub(REDACTED, value)

    def pair(m: re.Match[str]) -> str:
        if not is_secret_name(m.group(1)) or m.group(3) == REDACTED or m.group(3).startswith("$"):
            return m.group(0)
        return f"{m.group(1)}{m.group(2)}{REDACTED}"

    return _PAIR.sub(pair, value)


def value(obj: Any, secrets: Iterable[str] | None = None) -> Any:
    """A copy of a JSON-like value (dicts, lists, strings...) with its secrets redacted."""
    found = list(secret_values() if secrets is None else secrets)
    return _walk(obj, found)


def _walk(obj: Any, secrets: list[str]) -> Any:
    if isinstance(obj, str):
        return text(obj, secrets)
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            if isinstance(k, str) and is_secret_name(k) and isinstance(v, str) and v:
                out[k] = REDACTED
            else:
                out[k] = _walk(v, secrets)
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
    if _TOKEN_SHAPES.search(command):
        return "a token"
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
        return text(data.decode("utf-8", errors="surrogateescape")).encode(
            "utf-8", errors="surrogateescape"
        )
