"""Why something failed, in one line: the first line of a failure message, with the root cause
found in the log tail it carries. Pure (text in, text out).

A lifetime that dies before /health carries the server's last 40 log lines in its message
(``runtime.common.boot_failed``). Pasted as they are, they made a report, and the one-line error
of a run that ended without an answer, four copies of a traceback (issue 32, item 11: controls
on a release the pinned stack could not load). What a maintainer needs is the first error the
log shows: the failing import, the gate's verdict, the exception that started the traceback
(later lines are what it caused: "Engine core initialization failed. See root cause above").
"""

from __future__ import annotations

import re

#: vLLM's processes prefix every line ("(APIServer pid=4217) ", "(EngineCore_DP0 pid=9) ")
_PREFIX = re.compile(r"^\(\w+ pid=\d+\)\s?")
#: traceback scaffolding and links: never a cause
_NOISE = re.compile(
    r"^(Traceback \(most recent call last\)|File \"|\^+$|~+\^*~*$|For further information visit"
    r"|The above exception was the direct cause|During handling of the above exception)"
)
#: an exception line ("ImportError: ...", "pydantic_core._pydantic_core.ValidationError: ...")
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Fault))(: |$)")
#: a log line at error level, or what a dead process prints
_ERROR_LINE = re.compile(
    r"(\bERROR\b|\bCRITICAL\b|\bFATAL\b|^Killed$|Segmentation fault|core dumped"
    r"|out of memory|No module named|undefined symbol|cannot open shared object)"
)
#: pydantic says how many errors, and the next line says which
_COUNT_ONLY = re.compile(r"^\d+ validation errors? for \w+$")
#: pydantic's input echo ("[type=value_error, input_value=ArgsKwargs((), {...})]")
_PYDANTIC_ECHO = re.compile(r"\s*\[type=[^\]]*\]?\s*$")
#: the gate's verdict names both schemas in full; one line names the op
_SCHEMAS = re.compile(r": pinned '[^']*' vs candidate '[^']*'")
#: where the message's own line stops and the log it carries begins
_TAIL_MARK = "; log tail:"


def _lines(text: str) -> list[str]:
    """The log's lines without process prefixes and traceback scaffolding (a source line right
    after a ``File "..."`` line is scaffolding too)."""
    out: list[str] = []
    after_frame = False
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw).strip()
        if not line:
            continue
        if line.startswith('File "'):
            after_frame = True
            continue
        if after_frame:  # the frame's source line (its carets follow)
            after_frame = False
            continue
        if _NOISE.match(line):
            continue
        out.append(line)
    return out


def root_cause(log: str, limit: int = 240) -> str:
    """The first line of ``log`` that says what failed: an exception (with pydantic's reason
    when its line only counts errors), else a line at error level, else the last line."""
    lines = _lines(log)
    if not lines:
        return ""
    found = ""
    for i, line in enumerate(lines):
        match = _EXCEPTION.match(line)
        if match:
            name = match.group(1).rsplit(".", 1)[-1]  # pydantic_core._pydantic_core.X -> X
            text = line[match.end():].strip()
            found = f"{name}: {text}" if text else name
            if _COUNT_ONLY.match(text) and i + 1 < len(lines):
                found = f"{found}: {_PYDANTIC_ECHO.sub('', lines[i + 1])}"
            break
        if _ERROR_LINE.search(line):
            found = line
            break
    found = found or lines[-1]
    return found if len(found) <= limit else found[: limit - 3] + "..."


def one_line(message: str, limit: int = 400) -> str:
    """A failure message as one line: its own first line, and where it carries a log tail, the
    root cause from it instead of the tail ("server exited with code 1 before /health: ImportError:
    ..."). A gate's verdict is its own first line."""
    text = str(message or "").strip()
    if not text:
        return ""
    head, mark, tail = text.partition(_TAIL_MARK)
    if not mark:
        head, _, tail = text.partition("\n")
    head = _SCHEMAS.sub("", " ".join(head.split()))
    cause = root_cause(tail) if tail.strip() else ""
    out = f"{head}: {cause}" if cause and cause not in head else head
    return out if len(out) <= limit else out[: limit - 3] + "..."
