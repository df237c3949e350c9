"""What one completion returned, and how repeats of the same workload differ. Pure functions.

The observable is the seed thread's (vLLM issue 51187): emitted token ids, the chosen token's
logprob and the top-k alternatives with their ids, compared as exact doubles after the JSON
round trip. Floats are compared by their IEEE-754 bit pattern, so a change in the last bit is a
difference (and ``-0.0`` vs ``0.0`` or two NaNs are told apart or matched by bits, not by ``==``).
All repeat pairs are compared, not first-vs-rest: in the seed the differing pairs were
later-vs-later, e.g. (1,2) (1,3) (1,4) (2,4) (3,4).
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Top = tuple[tuple[int, float | None], ...]


class ResponseFormatError(ValueError):
    """A completion response that does not have the fields the probe asked for."""


@dataclass(frozen=True)
class Sample:
    """One request's output in one repeat."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float | None, ...]  # the chosen token's logprob per position
    top: tuple[Top, ...]  # per position: (id, logprob) in the order the server listed them

    def key(self) -> tuple[Any, ...]:
        """Equal keys iff the samples are bitwise identical."""
        return (
            self.token_ids,
            tuple(_bits(x) for x in self.logprobs),
            tuple(tuple((i, _bits(x)) for i, x in pos) for pos in self.top),
        )


def _bits(x: float | None) -> int | None:
    return None if x is None else struct.unpack("<q", struct.pack("<d", x))[0]


def _token_id(token: Any) -> int:
    # With return_tokens_as_token_ids vLLM writes tokens and top-logprob keys as "token_id:123".
    if isinstance(token, int) and not isinstance(token, bool):
        return token
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token[len("token_id:") :])
        except ValueError:
            pass
    raise ResponseFormatError(
        f"token {token!r} is not 'token_id:N'; the server ignored return_tokens_as_token_ids"
    )


def _float(x: Any) -> float | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise ResponseFormatError(f"logprob {x!r} is not a number")
    return float(x)


def parse_completion(response: Mapping[str, Any]) -> Sample:
    """The ``Sample`` in a ``/v1/completions`` response (first choice)."""
    try:
        choice = response["choices"][0]
        lp = choice["logprobs"]
    except (KeyError, IndexError, TypeError):
        raise ResponseFormatError("response has no choices[0].logprobs") from None
    if not isinstance(lp, Mapping):
        raise ResponseFormatError("choices[0].logprobs is null; the server ignored 'logprobs'")
    tokens = lp.get("tokens") or []
    ids_field = choice.get("token_ids")
    token_ids = tuple(
        _token_id(t) for t in (ids_field if ids_field is not None else tokens)
    )
    logprobs = tuple(_float(x) for x in lp.get("token_logprobs") or [])
    top: list[Top] = []
    for pos in lp.get("top_logprobs") or []:
        if pos is None:
            top.append(())
            continue
        if not isinstance(pos, Mapping):
            raise ResponseFormatError("top_logprobs entries must be objects")
        top.append(tuple((_token_id(k), _float(v)) for k, v in pos.items()))
    return Sample(token_ids=token_ids, logprobs=logprobs, top=tuple(top))


@dataclass(frozen=True)
class SampleDiff:
    first_position: int
    tokens_moved: bool
    #: over finite logprobs of the same token id at the same position, up to and including the
    #: first position whose emitted token differs: after it the two sequences have different
    #: contexts, and their logprobs differ by what the model says next, not by the kernels
    #: (issue 32: 0.354 on a lifetime whose like-for-like delta was 3.9e-3)
    max_abs_delta: float
    nonfinite: bool  # a logprob moved to or from inf/NaN/null (not counted in max_abs_delta)


#: what ``max_abs_logprob_delta`` covers, recorded with it (a detail without it was measured
#: over every position, after the tokens diverged too)
DELTA_SCOPE = "up_to_first_token_divergence"


def diff_samples(a: Sample, b: Sample) -> SampleDiff | None:
    """None when bitwise identical; else where and how much they differ. The logprob delta
    stops at the first position whose token differs (its top-k alternatives, computed from the
    same context, still count there; the chosen token's logprob does not, it is another
    token's)."""
    if a.key() == b.key():
        return None
    n = max(len(a.token_ids), len(b.token_ids), len(a.logprobs), len(b.logprobs),
            len(a.top), len(b.top))
    first: int | None = None
    max_delta = 0.0
    nonfinite = False

    def at(seq: Sequence[Any], i: int) -> Any:
        return seq[i] if i < len(seq) else None

    def delta(x: float | None, y: float | None) -> None:
        nonlocal max_delta, nonfinite
        if _bits(x) == _bits(y):
            return
        if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)):
            nonfinite = True
        else:
            max_delta = max(max_delta, abs(x - y))

    diverged = False
    for i in range(n):
        if diverged:
            break  # later positions follow different tokens: not the same computation
        ta, tb = at(a.token_ids, i), at(b.token_ids, i)
        la, lb = at(a.logprobs, i), at(b.logprobs, i)
        pa, pb = at(a.top, i) or (), at(b.top, i) or ()
        same = ta == tb and _bits(la) == _bits(lb)
        same = same and [(t, _bits(x)) for t, x in pa] == [(t, _bits(x)) for t, x in pb]
        if same:
            continue
        if first is None:
            first = i
        if ta == tb:
            delta(la, lb)
        else:
            diverged = True
        ya = dict(pa)
        for tok, y in pb:
            if tok in ya:
                delta(ya[tok], y)
    tokens_moved = a.token_ids != b.token_ids
    return SampleDiff(
        first_position=first if first is not None else 0,
        tokens_moved=tokens_moved,
        max_abs_delta=max_delta,
        nonfinite=nonfinite,
    )


@dataclass(frozen=True)
class Comparison:
    """All-pairs comparison of R repeats of one workload (repeats numbered from 0)."""

    repeats: int
    distinct_outputs: int
    differing_pairs: tuple[tuple[int, int], ...]
    pair_observations: tuple[tuple[int, int, int], ...]  # (i, j, diverging requests)
    diverging_observations: int  # (request, pair) observations that differ
    diverging_requests: tuple[int, ...]
    max_abs_logprob_delta: float
    first_divergent_position: int | None
    first_token_divergence_position: int | None
    tokens_moved: bool
    nonfinite: bool

    @property
    def divergent(self) -> bool:
        return bool(self.differing_pairs)

    def to_detail(self) -> dict[str, Any]:
        return {
            "repeats": self.repeats,
            "distinct_outputs": self.distinct_outputs,
            "differing_pairs": [[i, j] for i, j in self.differing_pairs],
            "pair_observations": [
                {"pair": [i, j], "requests": n} for i, j, n in self.pair_observations
            ],
            "diverging_observations": self.diverging_observations,
            "diverging_requests": list(self.diverging_requests),
            "max_abs_logprob_delta": self.max_abs_logprob_delta,
            "max_abs_logprob_delta_scope": DELTA_SCOPE,
            "first_divergent_position": self.first_divergent_position,
            "first_token_divergence_position": self.first_token_divergence_position,
            "tokens_moved": self.tokens_moved,
            "logprobs_only": self.divergent and not self.tokens_moved,
            "nonfinite_logprob_moved": self.nonfinite,
        }


def compare_repeats(repeats: Sequence[Sequence[Sample]]) -> Comparison:
    """Compare every pair of repeats; each repeat lists the samples in request order."""
    sizes = {len(r) for r in repeats}
    if len(sizes) > 1:
        raise ValueError(f"repeats have different request counts: {sorted(sizes)}")
    keys = [tuple(s.key() for s in r) for r in repeats]
    pairs: list[tuple[int, int]] = []
    pair_obs: list[tuple[int, int, int]] = []
    requests: set[int] = set()
    observations = 0
    max_delta = 0.0
    first: int | None = None
    first_token: int | None = None
    tokens_moved = False
    nonfinite = False
    for i, j in itertools.combinations(range(len(repeats)), 2):
        if keys[i] == keys[j]:
            continue
        n = 0
        for k, (a, b) in enumerate(zip(repeats[i], repeats[j], strict=True)):
            d = diff_samples(a, b)
            if d is None:
                continue
            n += 1
            requests.add(k)
            max_delta = max(max_delta, d.max_abs_delta)
            first = d.first_position if first is None else min(first, d.first_position)
            nonfinite = nonfinite or d.nonfinite
            if d.tokens_moved:
                tokens_moved = True
                pos = _first_token_difference(a.token_ids, b.token_ids)
                first_token = pos if first_token is None else min(first_token, pos)
        pairs.append((i, j))
        pair_obs.append((i, j, n))
        observations += n
    return Comparison(
        repeats=len(repeats),
        distinct_outputs=len(set(keys)),
        differing_pairs=tuple(pairs),
        pair_observations=tuple(pair_obs),
        diverging_observations=observations,
        diverging_requests=tuple(sorted(requests)),
        max_abs_logprob_delta=max_delta,
        first_divergent_position=first,
        first_token_divergence_position=first_token,
        tokens_moved=tokens_moved,
        nonfinite=nonfinite,
    )


def _first_token_difference(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))
