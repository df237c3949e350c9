"""How many servers share a GPU (``[runtime] lifetimes_per_gpu = "auto"``), and each one's KV cache.

vLLM sizes its own KV cache from the memory it may use: ``gpu_memory_utilization`` of the card,
less what the model's weights, the profile run's activations and the CUDA context take (v0.26
``vllm/v1/worker/gpu_worker.py``, ``determine_available_memory``). Several servers on one card
cannot each measure that (two profiling at once each count the other's memory as their own:
"Available KV cache memory: -0.67 GiB" on the H200), so the tool does it for them: it reads the
card's free memory once (``nvidia-smi``; else ``torch.cuda.mem_get_info`` on the pinned
interpreter), keeps vLLM's 10 % margin, splits the rest into equal budgets, one per server (the
controls' own included), and tells each server its KV cache size, the budget less the weights
and the overhead (``--kv-cache-memory-bytes``; vLLM then measures nothing, and servers boot side
by side), and a ``--gpu-memory-utilization`` of one budget (vLLM refuses to start when less
than that fraction of the card is free at its boot).

How many: as many as fit with the KV cache the probe's workload needs, at most
``AUTO_MOST_PER_GPU``: memory is not what crowds a 0.6B model on an H100 (80 GiB hold a dozen
such servers), the probe is. Measured on an H100 (scripts/gpu/knee.sh,
docs/bench/gpu-2026-12-07c-h100), the servers that kept the 44 co-resident sequences in every
repeat: 6 of 6, 7 of 8, 3 of 10, 4 of 12; a warm boot took 56-66 s at every count. So a card
holds at most ``AUTO_MOST_SERVERS_PER_GPU`` servers at once, the controls' counted: while the
controls' three servers run beside six lifetimes (nine on the card, past the knee, two
lifetimes short of 44 in the 2026-12-07b record), a seventh lifetime waits for a slot
(``GpuPool``'s ``most_servers``). A lifetime that misses the target while several share its
card lowers that card's share (``GpuPool.back_off``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bisect_tool.recipes.recipe import ProbeSettings, RuntimeSettings
from bisect_tool.runtime.gpus import KV_CACHE_SIZE_FLAG

GIB = 1024**3
#: the most servers "auto" puts on one card before any lifetime has shown how many the probe
#: tolerates: on the H100 4 each reached the target co-residency, 8 did not (issue 39); the
#: knee between is measured by scripts/gpu/knee.sh
AUTO_MOST_PER_GPU = 6
#: the most servers one card holds at once under "auto", lifetimes and the controls' own
#: together: the H100's knee (8 servers: 7 of 8 kept the target co-residency; 10: 3 of 10)
AUTO_MOST_SERVERS_PER_GPU = 8
#: vLLM's default gpu_memory_utilization leaves this share of the card alone
MARGIN = 0.10
#: what a server takes besides its weights and KV cache: the CUDA context, the profile run's
#: activations, cuBLAS workspaces (an estimate for an eager 0.6B model; knee.sh prints what
#: each server really held)
SERVER_OVERHEAD_BYTES = 2 * GIB
#: the KV cache when the model's config cannot be read (the H100 record's 3 GiB)
DEFAULT_KV_BYTES = 3 * GIB
UTILIZATION_FLAG = "--gpu-memory-utilization"

_NVIDIA_SMI_QUERY = ("--query-gpu=index,uuid,memory.free,memory.total",
                     "--format=csv,noheader,nounits")
_TORCH_SCRIPT = r"""
import json, torch
out = []
for i in range(torch.cuda.device_count()):
    free, total = torch.cuda.mem_get_info(i)
    out.append([str(i), free, total])
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Card:
    """One GPU's memory as read before the run's first server."""

    gpu: str
    free: int
    total: int


@dataclass(frozen=True)
class Sizing:
    """What "auto" decided for one run."""

    per_gpu: int
    kv_cache_bytes: int
    utilization: float
    controls_own_slot: bool
    card: Card
    why: str
    most_servers: int = AUTO_MOST_SERVERS_PER_GPU  # on one card at once, the controls' counted

    def server_args(self, args: Sequence[str]) -> tuple[str, ...]:
        """``args`` with the KV cache size and the memory share, unless they give their own."""
        out = list(args)
        if not any(a == KV_CACHE_SIZE_FLAG or a.startswith(KV_CACHE_SIZE_FLAG + "=")
                   for a in out):
            out += [KV_CACHE_SIZE_FLAG, str(self.kv_cache_bytes)]
        if not any(a == UTILIZATION_FLAG or a.startswith(UTILIZATION_FLAG + "=") for a in out):
            out += [UTILIZATION_FLAG, f"{self.utilization:.2f}"]
        return tuple(out)


#: (GPU ids, the pinned interpreter, its environment) -> each GPU's memory, [] when unknown
ReadCards = Callable[[Sequence[str], str, Mapping[str, str]], list[Card]]


def read_cards(gpus: Sequence[str], interpreter: str, env: Mapping[str, str]) -> list[Card]:
    """The listed GPUs' free and total memory: ``nvidia-smi`` (no CUDA context, a few ms), else
    ``torch.cuda.mem_get_info`` on the pinned interpreter; [] when neither answers."""
    found = _nvidia_smi() or _torch(interpreter, env)
    by_id = {c.gpu: c for c in found}
    return [by_id[g] for g in gpus if g in by_id]


def _nvidia_smi() -> list[Card]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        done = subprocess.run([exe, *_NVIDIA_SMI_QUERY], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    cards = []
    for line in done.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
            continue
        index, uuid, free_mib, total_mib = parts
        for gpu in (index, uuid):  # CUDA_VISIBLE_DEVICES takes either
            cards.append(Card(gpu, int(free_mib) * 1024**2, int(total_mib) * 1024**2))
    return cards


def _torch(interpreter: str, env: Mapping[str, str]) -> list[Card]:
    try:
        done = subprocess.run([interpreter, "-c", _TORCH_SCRIPT], capture_output=True,
                              text=True, timeout=120, check=False, cwd="/",
                              env={**os.environ, **env})
        rows = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return []
    return [Card(str(g), int(free), int(total)) for g, free, total in rows]


def weights_bytes(model: str) -> int:
    """The checkpoint's size on disk (what its weights take on the card, to a few percent)."""
    path = Path(model).expanduser() if model else None
    if path is None or not path.is_dir():
        return 0
    return sum(f.stat().st_size for f in path.iterdir()
               if f.suffix in (".safetensors", ".bin", ".pt") and f.is_file())


def kv_bytes_needed(model: str, probe: ProbeSettings, server_args: Sequence[str]) -> int:
    """The KV cache the probe's workload needs at once (every request resident for its whole
    length, vLLM's 16-token blocks), twice over, and at least one sequence of the model's
    longest; ``DEFAULT_KV_BYTES`` when the model's config cannot be read."""
    per_token = _kv_bytes_per_token(model)
    if not per_token:
        return DEFAULT_KV_BYTES
    block = 16

    def blocks(tokens: int) -> int:
        return math.ceil(tokens / block) * block

    need = (probe.requests * blocks(probe.prefix_tokens + probe.prompt_tokens + probe.max_tokens)
            + probe.fillers * blocks(probe.filler_tokens + probe.max_tokens))
    longest = _flag_int(server_args, "--max-model-len") or 0
    return max(2 * need, longest) * per_token


def _kv_bytes_per_token(model: str) -> int:
    config = Path(model).expanduser() / "config.json" if model else None
    try:
        c = json.loads(config.read_text()) if config is not None else {}
    except (OSError, ValueError):
        return 0
    layers = int(c.get("num_hidden_layers") or 0)
    heads = int(c.get("num_key_value_heads") or c.get("num_attention_heads") or 0)
    head_dim = int(c.get("head_dim") or 0) or (
        int(c.get("hidden_size") or 0) // max(1, int(c.get("num_attention_heads") or 1)))
    dtype = str(c.get("torch_dtype") or "float16")
    width = 4 if dtype == "float32" else 2
    return 2 * layers * heads * head_dim * width  # keys and values


def _flag_int(args: Sequence[str], flag: str) -> int | None:
    for i, a in enumerate(args):
        value = args[i + 1] if a == flag and i + 1 < len(args) else (
            a.split("=", 1)[1] if a.startswith(flag + "=") else None)
        if value is not None and value.isdigit():
            return int(value)
    return None


def size(
    runtime: RuntimeSettings,
    probe: ProbeSettings,
    cards: Sequence[Card],
    *,
    most: int = AUTO_MOST_PER_GPU,
) -> Sizing | None:
    """How many servers each of ``cards`` holds, and what each is told; None when the cards'
    memory is unknown (the run then gives each lifetime a GPU of its own)."""
    if not cards:
        return None
    card = min(cards, key=lambda c: c.free)  # every GPU the same: the tightest decides
    # a tensor-parallel server holds its share of the weights on each of its GPUs
    weights = weights_bytes(runtime.model) // max(1, runtime.gpus_per_lifetime)
    given_kv = _flag_int(runtime.server_args, KV_CACHE_SIZE_FLAG)
    kv_min = given_kv or kv_bytes_needed(runtime.model, probe, runtime.server_args)
    server = weights + SERVER_OVERHEAD_BYTES + kv_min
    usable = int(card.free - MARGIN * card.total)
    fit = max(0, usable // server)
    controls = probe.negative_servers if probe.controls else 0
    # the controls' servers take their slots on the first card only while it holds one
    # lifetime more than them: otherwise they share the lifetimes' slots
    own = controls > 0 and fit >= controls + 2
    per_gpu = max(1, min(most, fit - (controls if own else 0)))
    servers = per_gpu + (controls if own else 0)
    budget = usable // max(1, servers)
    kv = given_kv or max(kv_min, budget - weights - SERVER_OVERHEAD_BYTES)
    utilization = max(0.01, math.floor(100 * budget / card.total) / 100)
    gib = f"{card.free / GIB:.1f} of {card.total / GIB:.1f} GiB free"
    why = (f"GPU {card.gpu}: {gib}; a server takes {server / GIB:.1f} GiB (weights "
           f"{weights / GIB:.1f}, KV cache at least {kv_min / GIB:.2f}, overhead "
           f"{SERVER_OVERHEAD_BYTES / GIB:.0f}): {per_gpu} lifetimes a GPU"
           + (f" (at most {most} until the probe shows more keep their co-residency)"
              if fit - (controls if own else 0) > most else "")
           + (f", {controls} more servers for the controls (at most "
              f"{AUTO_MOST_SERVERS_PER_GPU} servers on a card at once)" if own else "")
           + f", each told a KV cache of {kv / GIB:.2f} GiB")
    return Sizing(per_gpu, kv, utilization, own, card, why)
