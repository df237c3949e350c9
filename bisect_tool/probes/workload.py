"""The server probe's workload: token-id prompts made from a seed, and the exact request bodies.

The seed thread (vLLM issue 51187) used M requests sharing a 16-token prefix plus F unrelated
filler requests, greedy, ``max_tokens=24``, ``logprobs=5``. Prompts here are token ids drawn
from a seeded RNG, so no tokenizer is needed (the server may run with ``--skip-tokenizer-init``)
and the traffic is byte-identical across repeats, lifetimes and machines.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

# Ids are drawn from [_LOW_ID, vocab_size - _HIGH_MARGIN): the lowest ids and the top of the
# embedding table hold special/added tokens in most vocabularies (Qwen3's config has 151,936
# rows but its tokenizer ends at 151,643); ordinary ids keep the prompt an ordinary prompt.
_LOW_ID = 100
_HIGH_MARGIN = 512


@dataclass(frozen=True)
class Workload:
    """M shared-prefix prompts followed by F fillers, in submission order."""

    prompts: tuple[tuple[int, ...], ...]
    shared: int  # the first `shared` prompts start with the common prefix

    @property
    def size(self) -> int:
        return len(self.prompts)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


def build_workload(
    requests: int,
    fillers: int,
    prefix_tokens: int,
    prompt_tokens: int,
    filler_tokens: int,
    vocab_size: int,
    seed: int,
) -> Workload:
    """The same arguments always give the same prompts (a seeded ``random.Random``)."""
    rng = random.Random(f"bisect-workload:{seed}")
    high = max(vocab_size - _HIGH_MARGIN, _LOW_ID + 1)
    low = min(_LOW_ID, high - 1)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(low, high) for _ in range(n))

    prefix = ids(prefix_tokens)
    shared = tuple(prefix + ids(prompt_tokens) for _ in range(requests))
    filler = tuple(ids(filler_tokens) for _ in range(fillers))
    return Workload(prompts=shared + filler, shared=requests)


def fresh_prompt(tokens: int, vocab_size: int, seed: int) -> tuple[int, ...]:
    """A prompt of ``tokens`` ids that no workload of this seed holds (its own generator): the
    prefix-cache check sends it cold, then warm."""
    rng = random.Random(f"bisect-cache-check:{seed}")
    high = max(vocab_size - _HIGH_MARGIN, _LOW_ID + 1)
    low = min(_LOW_ID, high - 1)
    return tuple(rng.randrange(low, high) for _ in range(max(tokens, 1)))


def request_body(
    prompt: tuple[int, ...], model: str, max_tokens: int, logprobs: int
) -> bytes:
    """One ``POST /v1/completions`` body, serialised once so every repeat sends the same bytes.

    ``ignore_eos`` keeps every sequence resident for all ``max_tokens`` steps: an early EOS
    would shrink the batch the probe is trying to form.
    """
    body = {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "seed": 0,
        "logprobs": logprobs,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }
    return json.dumps(body, separators=(",", ":")).encode()
