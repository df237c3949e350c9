"""One project page of a simple package index: PEP 691 (JSON) or PEP 503 (HTML).

Both forms give the same facts per file: its name, its URL (resolved against the page, fragment
dropped), the sha256 the index publishes, whether it is yanked (PEP 592) and its
``Requires-Python``. The release source picks a wheel from these; the release range
(``bisect_tool.artifacts.releases``) lists versions from them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

from packaging.utils import canonicalize_name

from bisect_tool.artifacts.download import Downloader
from bisect_tool.errors import ArtifactUnavailable

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
# PEP 691's negotiation: JSON preferred, HTML accepted (an index that only speaks PEP 503).
ACCEPT = f"{JSON_TYPE}, text/html;q=0.1"


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str  # absolute, without the #sha256= fragment
    sha256: str = ""  # lower-case hex; "" when the index publishes none
    yanked: str | None = None  # None: not yanked; "": yanked, no reason given; else the reason
    requires_python: str = ""

    @property
    def is_yanked(self) -> bool:
        return self.yanked is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "filename": self.filename,
            "url": self.url,
            "sha256": self.sha256,
            "yanked": self.yanked,
            "requires_python": self.requires_python,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IndexFile:
        yanked = data.get("yanked")
        return cls(
            filename=str(data["filename"]),
            url=str(data["url"]),
            sha256=str(data.get("sha256") or ""),
            yanked=None if yanked is None else str(yanked),
            requires_python=str(data.get("requires_python") or ""),
        )


def _split_hash(url: str) -> tuple[str, str]:
    """The URL without its fragment, and the sha256 the fragment carries ("" if none)."""
    plain, fragment = urldefrag(url)
    sha = fragment.split("=", 1)[1] if fragment.startswith("sha256=") else ""
    return plain, sha.lower()


def _name_from_url(url: str) -> str:
    return unquote(url.rsplit("/", 1)[-1])


class _Anchors(HTMLParser):
    """The anchors of a PEP 503 page. HTMLParser unescapes attribute values and text itself
    (``&lt;`` in data-requires-python arrives as ``<``)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.anchors: list[tuple[dict[str, str | None], str]] = []  # (attributes, text)
        self.base: str | None = None
        self._open: dict[str, str | None] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "base" and self.base is None:
            # pip honours <base href>: relative links then resolve against it, not the page.
            self.base = dict(attrs).get("href") or None
        elif tag == "a":
            self._close()  # an unclosed <a> ends where the next one starts
            self._open = dict(attrs)

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._close()

    def close(self) -> None:
        super().close()
        self._close()

    def _close(self) -> None:
        if self._open is not None:
            self.anchors.append((self._open, "".join(self._text).strip()))
        self._open = None
        self._text = []


def parse_html(text: str, page_url: str) -> list[IndexFile]:
    """The files of a PEP 503 page: each anchor's text is the file name (its URL's last part
    when empty), ``data-yanked`` present means yanked (its value is the reason) and
    ``data-requires-python`` is kept as written."""
    parser = _Anchors()
    parser.feed(text)
    parser.close()
    base = urljoin(page_url, parser.base) if parser.base else page_url
    files: list[IndexFile] = []
    for attrs, label in parser.anchors:
        href = attrs.get("href")
        if not href:
            continue
        url, sha = _split_hash(urljoin(base, href))
        files.append(
            IndexFile(
                filename=label or _name_from_url(url),
                url=url,
                sha256=sha,
                # A bare attribute (no value) is yanked without a reason.
                yanked=(attrs["data-yanked"] or "") if "data-yanked" in attrs else None,
                requires_python=attrs.get("data-requires-python") or "",
            )
        )
    return files


def _yanked_json(value: Any) -> str | None:
    # PEP 691: a boolean, or a non-empty string giving the reason. As pip reads it, a false
    # value (False, "", null) is not yanked.
    if isinstance(value, str):
        return value or None
    return "" if value else None


def parse_json(data: Any, page_url: str) -> list[IndexFile]:
    """The files of a PEP 691 page (``{"files": [...]}``); raises ValueError if it is not one."""
    if not isinstance(data, dict) or not isinstance(data.get("files", []), list):
        raise ValueError("no 'files' list")
    files: list[IndexFile] = []
    for item in data.get("files", []):
        if not isinstance(item, dict) or not item.get("url"):
            continue
        url, fragment_sha = _split_hash(urljoin(page_url, str(item["url"])))
        hashes = item.get("hashes")
        sha = str(hashes.get("sha256") or "") if isinstance(hashes, dict) else ""
        files.append(
            IndexFile(
                filename=str(item.get("filename") or _name_from_url(url)),
                url=url,
                sha256=sha.lower() or fragment_sha,
                yanked=_yanked_json(item.get("yanked")),
                requires_python=str(item.get("requires-python") or ""),
            )
        )
    return files


def parse_project_page(body: str, content_type: str, page_url: str) -> list[IndexFile]:
    """Either form, by the response's content type; ValueError for a malformed JSON page."""
    if "json" in content_type.lower():
        return parse_json(json.loads(body), page_url)
    return parse_html(body, page_url)


def project_url(index_url: str, package: str) -> str:
    """PEP 503: ``{index}/{normalized name}/``."""
    return f"{index_url.rstrip('/')}/{canonicalize_name(package)}/"


def fetch_project_files(
    downloader: Downloader, index_url: str, package: str
) -> tuple[list[IndexFile], str]:
    """Every file the index lists for ``package``, and the page's final URL (after redirects).

    Raises what ``downloader.get`` raises (``NotFound`` for a 404: the index has no such
    project; ``GaveUp`` when it cannot be reached) and ``ArtifactUnavailable`` for a page that
    is not a simple-index page.
    """
    url = project_url(index_url, package)
    response = downloader.get(url, headers={"Accept": ACCEPT})
    page = str(response.url)
    try:
        files = parse_project_page(response.text, response.headers.get("content-type", ""), page)
    except ValueError as exc:
        raise ArtifactUnavailable(
            f"{page} is not a simple-index page ({exc}); check the index URL"
        ) from None
    return files, page
