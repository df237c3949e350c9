"""Pure parts of the server probe: workload, response parsing, all-pairs comparison, metrics,
the verdict rule and the Markdown rendering."""

from __future__ import annotations

import json
import math

import pytest

from bisect_tool.errors import RecipeError
from bisect_tool.probes.compare import (
    ResponseFormatError,
    Sample,
    compare_repeats,
    parse_completion,
)
from bisect_tool.probes.metrics import gauge_sum
from bisect_tool.probes.render import render_op_detail, render_server_detail
from bisect_tool.probes.server_verdict import decide, target_coresidency, validate_settings
from bisect_tool.probes.workload import build_workload, request_body
from bisect_tool.recipes.recipe import ProbeSettings
from bisect_tool.values import Verdict


def sample(ids=(5, 6, 7), lps=(-0.5, -0.25, -1.0)) -> Sample:
    top = tuple(((i, lp), (i + 1, lp - 1.0)) for i, lp in zip(ids, lps, strict=True))
    return Sample(token_ids=tuple(ids), logprobs=tuple(lps), top=top)


def test_workload_is_deterministic_shares_prefix_and_stays_in_vocab() -> None:
    args = dict(
        requests=4, fillers=2, prefix_tokens=16, prompt_tokens=8, filler_tokens=5, vocab_size=1000
    )
    a = build_workload(seed=0, **args)
    assert a == build_workload(seed=0, **args)
    assert a != build_workload(seed=1, **args)
    assert a.size == 6 and a.shared == 4
    assert len({p[:16] for p in a.prompts[:4]}) == 1  # one shared prefix
    assert len({p for p in a.prompts[:4]}) == 4  # distinct suffixes
    assert all(len(p) == 5 for p in a.prompts[4:])
    assert all(100 <= t < 1000 for p in a.prompts for t in p)


def test_request_body_is_greedy_token_ids_with_logprobs() -> None:
    body = json.loads(request_body((1, 2, 3), "m", max_tokens=24, logprobs=5))
    assert body["prompt"] == [1, 2, 3] and body["model"] == "m"
    assert body["temperature"] == 0 and body["seed"] == 0
    assert body["max_tokens"] == 24 and body["logprobs"] == 5
    assert body["return_tokens_as_token_ids"] is True and body["return_token_ids"] is True


def vllm_response(ids, lps, with_token_ids=True) -> dict:
    choice = {
        "index": 0,
        "text": "",
        "logprobs": {
            "tokens": [f"token_id:{i}" for i in ids],
            "token_logprobs": list(lps),
            "top_logprobs": [
                {f"token_id:{i}": lp, f"token_id:{i + 1}": lp - 1.0}
                for i, lp in zip(ids, lps, strict=True)
            ],
            "text_offset": [0] * len(ids),
        },
    }
    if with_token_ids:
        choice["token_ids"] = list(ids)
    return {"choices": [choice]}


@pytest.mark.parametrize("with_token_ids", [True, False])
def test_parse_completion_reads_ids_logprobs_and_topk(with_token_ids: bool) -> None:
    got = parse_completion(
        json.loads(json.dumps(vllm_response((5, 6, 7), (-0.5, -0.25, -1.0), with_token_ids)))
    )
    assert got == sample()


def test_parse_completion_names_a_missing_field() -> None:
    with pytest.raises(ResponseFormatError, match="logprobs"):
        parse_completion({"choices": [{"text": "hi", "logprobs": None}]})
    bad = vllm_response((5,), (-0.5,), with_token_ids=False)
    bad["choices"][0]["logprobs"]["tokens"] = ["hello"]
    with pytest.raises(ResponseFormatError, match="return_tokens_as_token_ids"):
        parse_completion(bad)


def test_last_bit_difference_after_json_round_trip_is_found() -> None:
    lp = -0.123456789
    moved = math.nextafter(lp, -math.inf)
    a = parse_completion(json.loads(json.dumps(vllm_response((5, 6, 7), (-0.5, lp, -1.0)))))
    b = parse_completion(json.loads(json.dumps(vllm_response((5, 6, 7), (-0.5, moved, -1.0)))))
    c = compare_repeats([[a], [b]])
    assert c.divergent and c.differing_pairs == ((0, 1),)
    assert c.max_abs_logprob_delta == abs(lp - moved) > 0
    assert c.first_divergent_position == 1
    assert not c.tokens_moved and c.to_detail()["logprobs_only"] is True


def test_all_pairs_are_compared_not_first_vs_rest() -> None:
    base, other = sample(), sample(lps=(-0.5, -0.25, -1.5))
    # Repeats 1 and 3 agree with each other but not with 0, 2 and 4 (later-vs-later pairs).
    c = compare_repeats([[base, base], [base, other], [base, base], [base, other], [base, base]])
    assert c.differing_pairs == ((0, 1), (0, 3), (1, 2), (1, 4), (2, 3), (3, 4))
    assert c.distinct_outputs == 2
    assert c.diverging_observations == 6  # request 1 in each of the six pairs
    assert c.diverging_requests == (1,)
    assert c.max_abs_logprob_delta == 0.5
    assert c.first_divergent_position == 2


def test_identical_repeats_and_token_divergence() -> None:
    same = compare_repeats([[sample()], [sample()], [sample()]])
    assert not same.divergent and same.distinct_outputs == 1
    assert same.first_divergent_position is None
    moved = compare_repeats([[sample()], [sample(ids=(5, 9, 7))]])
    assert moved.tokens_moved and moved.first_token_divergence_position == 1
    assert moved.to_detail()["logprobs_only"] is False


def test_zero_sign_and_nan_are_compared_by_bits() -> None:
    assert compare_repeats([[sample(lps=(0.0, -1, -1))], [sample(lps=(-0.0, -1, -1))]]).divergent
    nan = float("nan")
    assert not compare_repeats([[sample(lps=(nan, -1, -1))], [sample(lps=(nan, -1, -1))]]).divergent
    inf = compare_repeats([[sample(lps=(-math.inf, -1, -1))], [sample(lps=(-1.0, -1, -1))]])
    assert inf.divergent and inf.nonfinite and math.isfinite(inf.max_abs_logprob_delta)
    json.dumps(inf.to_detail(), allow_nan=False)  # stays strict JSON


def test_gauge_sums_label_sets_and_ignores_lookalikes() -> None:
    text = (
        "# HELP vllm:num_requests_running Number of requests.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="a b}"} 30.0\n'
        'vllm:num_requests_running{engine="1",model_name="q\\"x"} 14.0 1712345678\n'
        'vllm:num_requests_running_total{engine="0"} 99.0\n'
        'vllm:num_requests_waiting{engine="0"} 7.0\n'
    )
    assert gauge_sum(text) == 44.0
    assert gauge_sum(text, "vllm:num_requests_waiting") == 7.0
    assert gauge_sum("vllm:num_requests_running 3\n") == 3.0
    assert gauge_sum("# nothing here\n") is None


def test_target_and_settings_validation() -> None:
    s = ProbeSettings(requests=31, fillers=13)
    assert target_coresidency(s) == 44
    assert target_coresidency(ProbeSettings(target_coresidency=40)) == 40
    assert target_coresidency(s, sequential=True) == 0
    with pytest.raises(RecipeError, match="target_coresidency"):
        validate_settings(ProbeSettings(requests=2, fillers=1, target_coresidency=4))
    with pytest.raises(RecipeError, match="repeats"):
        validate_settings(ProbeSettings(repeats=1))


def test_decide_divergent_clean_inconclusive() -> None:
    clean = compare_repeats([[sample()]] * 3)
    diverged = compare_repeats([[sample()], [sample(lps=(-0.5, -0.25, -1.5))], [sample()]])
    verdict, message = decide(diverged, [10, 10, 10], 44)  # divergence wins, batch or not
    assert verdict is Verdict.DIVERGENT and "(0,1) (1,2)" in message
    assert decide(clean, [44, 45, 44], 44)[0] is Verdict.CLEAN
    verdict, message = decide(clean, [44, 36, 44], 44)
    assert verdict is Verdict.INCONCLUSIVE and "repeat 1: 36" in message
    assert decide(clean, [44, None, 44], 44)[0] is Verdict.INCONCLUSIVE
    assert decide(clean, [1, 1, 1], 0)[0] is Verdict.CLEAN  # sequential: no target


def test_render_server_detail_shows_what_the_seed_reported() -> None:
    diverged = compare_repeats([[sample()], [sample(lps=(-0.5, -0.25, -1.5))], [sample()]])
    detail = {
        "lifetime_id": "abc123-0",
        "mode": "concurrent",
        "requests": 31,
        "fillers": 13,
        "max_tokens": 24,
        "jitter_ms": 40.0,
        "coresidency_per_repeat": [44, 44, 43],
        "max_coresidency": 44,
        "target_coresidency": 44,
        "redone_repeats": 1,
        **diverged.to_detail(),
    }
    md = render_server_detail(detail)
    assert "| distinct outputs / repeats | 2 / 3 |" in md
    assert "| repeat pairs that differ | (0,1) (1,2) |" in md
    assert "| what moved | logprobs only |" in md
    assert "| co-residency reached (per repeat) | 44 (44, 44, 43) |" in md
    assert "| repeats redone | 1 |" in md


def test_render_op_detail_one_row_per_group() -> None:
    detail = {
        "library": "_C.so",
        "torch": "2.11.0",
        "device": "H200",
        "row_counts": [255, 300],
        "env": {"VLLM_BATCH_INVARIANT": "1"},
        "groups": [
            {
                "op": "rms_norm",
                "dtype": "float16",
                "hidden": 4096,
                "differing": 16,
                "total": 16,
                "max_abs_diff": 0.0009765625,
                "nonfinite": False,
            },
            {
                "op": "rms_norm",
                "dtype": "float16",
                "hidden": 512,
                "differing": 0,
                "total": 16,
                "max_abs_diff": 0.0,
                "nonfinite": False,
            },
        ],
    }
    md = render_op_detail(detail)
    assert "| rms_norm | float16 | 4096 | 16/16 | 9.766e-04 |" in md
    assert "| rms_norm | float16 | 512 | 0/16 | 0 |" in md
    assert "255-row launch vs a 300-row launch" in md
    assert "no cases ran: boom" in render_op_detail({"error": "boom"})


def test_the_logprob_delta_stops_where_the_tokens_diverge() -> None:
    """Issue 32, item 4: after the first differing token the two sequences have different
    contexts; their logprobs differ by what the model says next (0.354 on the H200's
    vllm-0.26.0-0, whose like-for-like delta was ~3.9e-3). The delta covers the positions up to
    that token (its top-k alternatives included) and no further."""
    before = sample(ids=(5, 6, 7), lps=(-0.5, -0.25, -1.0))
    after = Sample(
        token_ids=(5, 9, 7),  # the token at position 1 differs
        logprobs=(-0.5 - 2.0 ** -10, -0.3, -1.0 - 0.354),  # position 2: a different context
        top=(((5, -0.5 - 2.0 ** -10),), ((6, -0.25 - 2.0 ** -8), (9, -0.3)), ((7, -1.354),)),
    )
    c = compare_repeats([[before], [after]])
    assert c.tokens_moved and c.first_token_divergence_position == 1
    assert c.first_divergent_position == 0  # a logprob moved before any token did
    assert c.max_abs_logprob_delta == 2.0 ** -8  # position 1's shared alternative; not 0.354
    assert c.to_detail()["max_abs_logprob_delta_scope"] == "up_to_first_token_divergence"
