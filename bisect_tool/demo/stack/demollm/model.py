"""The model: token embeddings, a few layers with a causal running-mean "attention", an LM head.

Weights come from a fixed seed at a realistic scale (unit-variance embeddings, He-scaled layers,
logits with a standard deviation of a few nats): with tiny weights the softmax is near-uniform and
last-bit differences vanish below float32 resolution, which is how vLLM's dummy weights hide the
RMSNorm bug (vllm-facts.md, "Dummy weights hide the bug").

Batch invariance: every computation on a row is done row by row (matrix-vector products, one
call per row: numpy's matrix-matrix path rounds a row differently depending on its position in
the tile) or per request (the running means), or with correctly rounded elementwise operations.
The only exception is the compiled RMSNorm, which sees the whole step at once.

That holds in batch-invariant mode (``VLLM_BATCH_INVARIANT=1``, ``ModelConfig.batch_invariant``).
With the switch off the layers' matmuls behave like cuBLAS's do without vLLM's batch-invariant
kernels: a launch of fewer than ``SPLIT_K_BELOW`` tokens splits the reduction over the hidden
dimension in two and adds the halves (split-K, which small launches get for parallelism), so a
row's rounding depends on how many tokens share its step at almost every step size, not only
across 256. That is what vLLM's positive control relies on: with the switch off the engine is
visibly not batch-invariant, whatever the planted kernel does.

Two more paths, both asked for by the engine (``demollm.engine``), never by the step's size:

- ``warmup``: the steps before "CUDA graphs are captured" (a vLLM server's first requests after
  start-up take the JIT-compiled path, vLLM #33537) split K in every matmul, in either mode, so
  the first request after start computes differently from the same request later;
- a segment may start from a cached prefix (prefix caching): its running sums come from the
  cache (``Segment.snapshots`` of an earlier request) and the step adds its own tokens' sums to
  them, a different rounding order than summing the whole prompt at once (vLLM #40896, #42019).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from demollm._custom_ops import Kernels


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 2048
    hidden_size: int = 384
    num_layers: int = 2
    rms_norm_eps: float = 1e-6
    context_weight: float = (
        0.5  # how much of the causal mean of earlier positions each row mixes in
    )
    logit_scale: float = 4.0  # standard deviation of the logits, in nats
    max_model_len: int = 1024
    seed: int = 0
    batch_invariant: bool = True  # the matmuls' mode (the kernels read the switch themselves)


# Below this many tokens in a step, a non-batch-invariant matmul splits K (see the docstring).
SPLIT_K_BELOW = 64


@dataclass
class Segment:
    """One request's rows in a step: its new tokens and its running sums (the "KV cache")."""

    tokens: np.ndarray  # int64, the tokens processed for this request in this step
    sums: list[np.ndarray]  # per layer, float32 (hidden,): sum of that layer's inputs so far
    count: int  # positions already in `sums`
    # prefix caching: positions whose running sums to keep (``snapshots[p]``: the sums of the
    # first p positions, per layer) once this step computes them
    snap_at: tuple[int, ...] = ()
    snapshots: dict[int, list[np.ndarray]] = field(default_factory=dict)


class DemoModel:
    def __init__(self, config: ModelConfig, kernels: Kernels) -> None:
        self.config = config
        self.kernels = kernels
        h, v = config.hidden_size, config.vocab_size
        rng = np.random.default_rng(config.seed)
        self.embed = rng.standard_normal((v, h), dtype=np.float32)
        self.norms = [
            (1.0 + 0.1 * rng.standard_normal(h)).astype(np.float32)
            for _ in range(config.num_layers + 1)
        ]
        self.layers = [
            (rng.standard_normal((h, h), dtype=np.float32) * np.float32(np.sqrt(2.0 / h)))
            for _ in range(config.num_layers)
        ]
        self.lm_head = rng.standard_normal((h, v), dtype=np.float32) * np.float32(
            config.logit_scale / np.sqrt(h)
        )
        self._alpha = np.float32(config.context_weight)
        self._eps = float(config.rms_norm_eps)

    def new_sums(self) -> list[np.ndarray]:
        h = self.config.hidden_size
        return [np.zeros(h, dtype=np.float32) for _ in range(self.config.num_layers)]

    def forward(self, segments: Sequence[Segment], warmup: bool = False) -> list[np.ndarray]:
        """Run one step over all the segments' tokens; returns each segment's last-row logprobs
        (float32, (vocab,)) and advances the segments' running sums in place. ``warmup``: a
        step before the graphs are captured (see the module's docstring)."""
        tokens = np.concatenate([s.tokens for s in segments])
        bounds = np.cumsum([0] + [len(s.tokens) for s in segments])
        x = np.ascontiguousarray(self.embed[tokens])
        residual = x.copy()
        h = self.kernels.rms_norm(x, self.norms[0], self._eps)
        y = np.empty_like(h)
        for layer, weight in enumerate(self.layers):
            mixed = np.empty_like(h)
            for seg, start, end in zip(segments, bounds[:-1], bounds[1:], strict=True):
                # Causal mean of this request's layer inputs up to each position (attention's
                # stand-in: a prompt row computed in one step shapes every later token).
                sums = np.cumsum(h[start:end], axis=0) + seg.sums[layer]
                counts = np.arange(seg.count + 1, seg.count + 1 + end - start, dtype=np.float32)
                mixed[start:end] = h[start:end] + self._alpha * (sums / counts[:, None])
                seg.sums[layer] = sums[-1].copy()
                for p in seg.snap_at:
                    if seg.count < p <= seg.count + end - start:
                        seg.snapshots.setdefault(p, []).append(sums[p - seg.count - 1].copy())
            if not warmup and (self.config.batch_invariant or len(tokens) >= SPLIT_K_BELOW):
                for row in range(len(tokens)):
                    np.dot(mixed[row], weight, out=y[row])
            else:
                k = self.config.hidden_size // 2
                for row in range(len(tokens)):
                    np.add(np.dot(mixed[row, :k], weight[:k]), np.dot(mixed[row, k:], weight[k:]),
                           out=y[row])
            np.maximum(y, np.float32(0.0), out=y)
            self.kernels.fused_add_rms_norm(y, residual, self.norms[layer + 1], self._eps)
            h, y = y, h
        for seg in segments:
            seg.count += len(seg.tokens)
        out = []
        for end in bounds[1:]:
            logits = np.dot(h[end - 1], self.lm_head)
            shifted = logits - logits.max()
            out.append(shifted - np.log(np.exp(shifted).sum(dtype=np.float32)))
        return out
