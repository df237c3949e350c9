"""The op check's cases for ops beyond the plain RMSNorm pair, built from each op's own schema
(issue 40): vLLM's quantized RMSNorm ops (#48997 pins their block size: 1024 for the static fp8
pair, 512 for the per-block one) and the fused-MoE path's compiled ops (#57016).

Standalone, like ``op_child.py`` (stdlib here; torch only inside the functions that make
tensors): it runs in the child interpreter on the GPU machine. The call is planned from the
schema the extension registers (``str(op.default._schema)``), read by ``parse_schema``: every
argument gets the value of its name (``values_for``), so a commit that adds an optional argument
or renames one is a one-line "no value for argument" error, never a wrong call; and every
argument the schema marks written (``Tensor!``, ``Tensor(a!)``) is compared, its first rows of
a 255-row launch against the same rows of a 300-row launch, bitwise.

The schemas, as vLLM's ``csrc/torch_bindings.cpp`` and ``csrc/moe/torch_bindings.cpp`` define
them in the 0.26/0.27 era (``tests/test_probe_op.py`` plans each against these texts):
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

VLLM_SCHEMAS = {
    "rms_norm_static_fp8_quant": (
        "rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor weight, Tensor scale, "
        "float epsilon) -> ()"
    ),
    "fused_add_rms_norm_static_fp8_quant": (
        "fused_add_rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor! residual, "
        "Tensor weight, Tensor scale, float epsilon) -> ()"
    ),
    "rms_norm_per_block_quant": (
        "rms_norm_per_block_quant(Tensor! result, Tensor input, Tensor weight, Tensor! scale, "
        "float epsilon, Tensor? scale_ub, Tensor!? residual, int group_size, "
        "bool is_scale_transposed) -> ()"
    ),
    # _moe_C; older builds lack renormalize, newer ones add a softcap and a bias: the plan
    # follows whichever the candidate registers
    "topk_softmax": (
        "topk_softmax(Tensor! topk_weights, Tensor! topk_indices, Tensor! token_expert_indices, "
        "Tensor gating_output, bool renormalize) -> ()"
    ),
    "moe_sum": "moe_sum(Tensor input, Tensor! output) -> ()",
}
#: the ops this module can check (the op check's other two are op_child's own)
CHECKED = frozenset(VLLM_SCHEMAS)
#: fp8 quantization's group width (DeepSeek-style 1x128 blocks) and the static scale, small
#: enough that normalised rows (|x| up to ~5) stay far inside e4m3's 448
GROUP_SIZE = 128
STATIC_SCALE = 0.02
#: a Qwen3-MoE-like router: 64 experts, 8 chosen per token
EXPERTS, TOPK = 64, 8


class PlanError(ValueError):
    """The registered schema asks for an argument the check has no value for."""


@dataclass(frozen=True)
class Arg:
    name: str
    type: str  # "Tensor", "Tensor?", "float", "int", "bool", ...
    written: bool  # the op writes it (compared between the launches)


# the alias set: "(a!)" as torch printed it, "($0! -> )" as torch 2.11 prints a stable-ABI op's
# (vLLM 0.26.0's _C::rms_norm_static_fp8_quant on the H100, docs/bench/gpu-2026-12-07b-h100)
_ARG = re.compile(r"^(?P<type>[A-Za-z_]+[A-Za-z0-9_]*)"
                  r"(?P<alias>\([$\w|]+!?(?:\s*->\s*[^)]*)?\)|!)?(?P<opt>\?)?\s+"
                  r"(?P<name>\w+)(?:\s*=\s*.+)?$")


def _arguments(rest: str) -> list[str]:
    """The arguments of a schema's text after its first "(", split at the commas outside
    parentheses, up to the ")" that closes the list (an alias set may hold "->" and ",")."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(rest):
        if ch == "(":
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif ch == ")":
            parts.append(rest[start:i])
            break
        elif ch == "," and not depth:
            parts.append(rest[start:i])
            start = i + 1
    return [p.strip() for p in parts if p.strip()]


def parse_schema(text: str) -> tuple[str, list[Arg]]:
    """``("ns::op" or "op", [Arg, ...])`` of a schema as the bindings define it
    (``Tensor! result``, ``Tensor!? residual``) or as torch prints it (``Tensor(a!) result``,
    ``Tensor(b!)? residual``, ``Tensor($0! -> ) result``)."""
    text = " ".join(text.split())
    head, _, rest = text.partition("(")
    args: list[Arg] = []
    for part in _arguments(rest):
        if part == "*":
            continue  # keyword-only marker
        m = _ARG.match(part)
        if m is None:
            raise PlanError(f"cannot read argument '{part}' of schema {text!r}")
        alias = m.group("alias") or ""
        args.append(Arg(m.group("name"), m.group("type") + (m.group("opt") or ""),
                        written="!" in alias))
    return head.strip(), args


#: written arguments whose values depend on the launch's row count by construction, so they
#: differ between a 255-row and a 300-row launch on any build: not compared. vLLM's
#: ``csrc/moe/topk_softmax_kernels.cu`` writes ``token_expert_indices`` (its ``source_rows``)
#: as ``k_idx * num_rows + row``; the H100 run of 2026-12-07c read it as a divergence on both
#: 0.26.0 and 0.27.0, 8 of 8, the largest difference 315 = 7 x (300 - 255)
#: (docs/bench/gpu-2026-12-07c-h100). ``topk_weights`` and ``topk_indices`` are compared.
LAUNCH_SIZED = {"topk_softmax": ("token_expert_indices",)}


def plan_call(
    op: str, args: Sequence[Arg], values: Mapping[str, Any]
) -> tuple[list[Any], list[str]]:
    """The positional values of a call of ``op`` and the names it writes and the check compares
    (pure; ``LAUNCH_SIZED`` left out). An optional argument (``Tensor?``) with no value is
    passed None; any other missing one is refused."""
    call: list[Any] = []
    for a in args:
        if a.name in values:
            call.append(values[a.name])
        elif a.type.endswith("?"):
            call.append(None)
        else:
            raise PlanError(f"no value for argument '{a.name}' ({a.type}) of {op}: its schema "
                            "changed; teach bisect_tool/probes/op_cases.py the new argument")
    sized = LAUNCH_SIZED.get(bare(op), ())
    return call, [a.name for a in args
                  if a.written and values.get(a.name) is not None and a.name not in sized]


def bare(op: str) -> str:
    return op.split("::", 1)[-1]


def values_for(torch: Any, op: str, dtype: Any, draws: Mapping[str, Any], n: int,
               device: str, eps: float) -> dict[str, Any]:
    """Every argument ``op`` may take, by its vLLM name, for a launch of the first ``n`` rows of
    ``draws`` (made once per case by ``draws_for``); outputs fresh, inputs copied."""
    name = bare(op)
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if name in ("topk_softmax",):
        k = draws["topk"]
        return {
            "topk_weights": torch.empty(n, k, device=device, dtype=torch.float32),
            "topk_indices": torch.empty(n, k, device=device, dtype=torch.int32),
            "topk_ids": torch.empty(n, k, device=device, dtype=torch.int32),
            "token_expert_indices": torch.empty(n, k, device=device, dtype=torch.int32),
            "gating_output": draws["gating"][:n].clone(),
            "renormalize": True,  # Qwen3-MoE's norm_topk_prob
            "moe_softcapping": 0.0,
        }
    if name == "moe_sum":
        per_expert = draws["per_expert"]
        return {"input": per_expert[:n].clone(),
                "output": torch.empty(n, per_expert.shape[-1], device=device, dtype=dtype)}
    x, hidden = draws["x"], draws["x"].shape[-1]
    values: dict[str, Any] = {
        "input": x[:n].clone(),
        "weight": draws["weight"],
        "epsilon": eps,
        "result": torch.empty(n, hidden, device=device, dtype=fp8),
    }
    if name == "rms_norm_per_block_quant":
        values.update({
            "scale": torch.empty(n, hidden // GROUP_SIZE, device=device, dtype=torch.float32),
            "group_size": GROUP_SIZE,
            "is_scale_transposed": False,
            "scale_ub": None,
            "residual": None,
        })
    else:
        values["scale"] = torch.tensor([STATIC_SCALE], device=device, dtype=torch.float32)
        values["residual"] = draws["residual"][:n].clone()
    return values


def draws_for(torch: Any, op: str, dtype: Any, hidden: int, seed: int, rows: int,
              device: str) -> dict[str, Any]:
    """The case's random inputs, ``rows`` of them, drawn on the CPU from ``seed`` (the same
    numbers on every device), then moved."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def normal(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    name = bare(op)
    if name == "topk_softmax":
        return {"gating": normal(rows, EXPERTS), "topk": TOPK}
    if name == "moe_sum":
        return {"per_expert": normal(rows, TOPK, hidden)}
    x = normal(rows, hidden)
    weight = (1.0 + 0.1 * torch.randn(hidden, generator=gen)).to(device=device, dtype=dtype)
    return {"x": x, "weight": weight, "residual": normal(rows, hidden)}


def run_schema_case(torch: Any, fn: Callable[..., Any], op: str, schema: str, dtype: Any,
                    hidden: int, seed: int, rows: tuple[int, int], eps: float, device: str,
                    compare: Callable[[Any, Any], tuple[bool, float]],
                    host: Callable[[Any], Any]) -> tuple[bool, float]:
    """One case: ``fn`` on the first ``big`` rows and on the first ``small``; every written
    argument's first ``small`` rows compared (``compare`` on ``host`` copies)."""
    small, big = rows
    _, args = parse_schema(schema)
    draws = draws_for(torch, op, dtype, hidden, seed, big, device)
    written: list[dict[str, Any]] = []
    for n in (big, small):
        values = values_for(torch, op, dtype, draws, n, device, eps)
        call, names = plan_call(op, args, values)
        fn(*call)
        written.append({k: values[k] for k in names})
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    if not written[0]:
        raise PlanError(f"{op} writes none of its arguments: nothing to compare")
    equal, worst = True, 0.0
    for key, out in written[0].items():
        eq, diff = compare(host(out[:small]), host(written[1][key]))
        equal, worst = equal and eq, max(worst, diff)
    return equal, worst
