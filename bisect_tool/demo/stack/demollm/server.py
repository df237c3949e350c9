"""The OpenAI-compatible HTTP server: ``python -m demollm.server --host 127.0.0.1 --port N``.

Speaks the subset of vLLM's API the bisect probe uses: ``POST /v1/completions`` (token-id
prompts, greedy, top-k logprobs, ``return_tokens_as_token_ids``, ``return_token_ids``),
``GET /health`` (503 once the engine is dead), ``GET /metrics`` (Prometheus text with vLLM's
gauge names) and ``GET /v1/models``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from demollm import __version__
from demollm._custom_ops import Kernels, KernelsUnavailable
from demollm.engine import (
    STEP_BUCKETS,
    WARMUP_STEPS,
    DeviceTiming,
    EngineOptions,
    LLMEngine,
    Request,
    RequestError,
    SchedulerConfig,
)
from demollm.loop import EngineLoop
from demollm.model import DemoModel, ModelConfig

logger = logging.getLogger("demollm")


class Peers:
    """The demo servers sharing this server's device: one file a server, named by its pid, in
    ``root/<device>`` (``DEMOLLM_DEVICE_DIR``; the device is ``CUDA_VISIBLE_DEVICES``, as the
    tool sets it for each lifetime). A file whose process is gone does not count."""

    def __init__(self, root: str, device: str) -> None:
        self.dir = Path(root) / (device.replace(",", "_").replace("/", "_") or "cpu") \
            if root else None
        self.me: Path | None = None
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.me = self.dir / str(os.getpid())
            self.me.write_text("")
        self._counted = (0.0, 1)

    def count(self) -> int:
        """Servers on the device now, this one included (re-read at most every 0.2 s)."""
        if self.dir is None:
            return 1
        at, n = self._counted
        if time.monotonic() - at < 0.2:
            return n
        n = 0
        for entry in self.dir.iterdir():
            try:
                os.kill(int(entry.name), 0)
            except (ValueError, ProcessLookupError):
                continue
            except PermissionError:
                pass  # alive, another user's
            n += 1
        self._counted = (time.monotonic(), max(1, n))
        return max(1, n)

    def close(self) -> None:
        if self.me is not None:
            self.me.unlink(missing_ok=True)


class HandOver:
    """A model of crowding, the demo's stand-in for servers sharing one machine (``--crowd-ms``):
    each request's hand-over from the HTTP side to the engine costs ``crowd_ms`` for every other
    server on the device, one request at a time, as an API server process waiting for a core
    hands a burst over in turn. A burst thus spreads in time as servers are added, and fewer of
    its requests are in the engine at once: the co-residency the probe reaches falls with the
    number of servers, as it did with 8 vLLM servers on one H100 (38-42 of 44: bisect's issue
    39). 0 (the default): no crowding, whatever shares the device. A model, not a measurement:
    its cost per server is the flag's, stated by whoever sets it."""

    def __init__(self, crowd_ms: float, peers: Peers) -> None:
        self.crowd_s = max(0.0, crowd_ms) / 1000.0
        self.peers = peers
        self._free_at = 0.0
        self._lock = threading.Lock()

    def arrival(self, arrived: float) -> float:
        """When a request that arrived at ``arrived`` reaches the engine."""
        cost = self.crowd_s * (self.peers.count() - 1)
        if cost <= 0:
            return arrived
        with self._lock:
            self._free_at = max(arrived, self._free_at) + cost
            return self._free_at


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], loop: EngineLoop, model_name: str,
                 handover: HandOver | None = None) -> None:
        super().__init__(address, Handler)
        self.loop = loop
        self.model_name = model_name
        self.handover = handover


class Handler(BaseHTTPRequestHandler):
    server: ApiServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib's name)
        logger.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, kind: str) -> None:
        body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
        self._send(status, json.dumps(body).encode())

    def do_GET(self) -> None:  # noqa: N802 (stdlib's name)
        loop = self.server.loop
        if self.path == "/health":
            self._send(200 if loop.alive else 503, b"")
        elif self.path == "/metrics":
            self._send(200, _metrics(self.server).encode(), "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            card = {"id": self.server.model_name, "object": "model", "owned_by": "demollm"}
            self._send(200, json.dumps({"object": "list", "data": [card]}).encode())
        else:
            self._error(404, f"no route {self.path}", "NotFoundError")

    def do_POST(self) -> None:  # noqa: N802 (stdlib's name)
        arrived, declared = _arrival(self.headers.get(ARRIVAL_HEADER), time.monotonic())
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path != "/v1/completions":
            self._error(404, f"no route {self.path}", "NotFoundError")
            return
        loop = self.server.loop
        if not loop.alive:
            self._error(503, "engine is dead", "EngineDeadError")
            return
        if self.server.handover is not None:
            arrived = self.server.handover.arrival(arrived)
        try:
            body = json.loads(raw)
            request = _parse(body, loop.engine, self.server.model_name, arrived, declared)
        except (ValueError, TypeError, KeyError) as exc:
            self._error(400, str(exc), "BadRequestError")
            return
        created = int(time.time())
        try:
            done = loop.submit(request).result()
        except RuntimeError as exc:
            self._error(500, str(exc), "InternalServerError")
            return
        self._send(200, json.dumps(_response(done, body, created, self.server.model_name)).encode())


#: the probe's header: when the request was meant to arrive (CLOCK_MONOTONIC, same host)
ARRIVAL_HEADER = "X-Bisect-Arrival"
#: how far back an intended arrival may lie: beyond this it is not this request's (another
#: host's clock, a replayed request), and the time it reached us stands
MAX_LATENESS_S = 2.0


def _arrival(header: str | None, now: float) -> tuple[float, bool]:
    """When the request arrived on the device clock, and whether the client declared it: the
    client's intended time when it sent one (a timer that woke late, or this HTTP thread
    waiting for a core, would otherwise move it, and with it how the engine's steps form: the
    load would change the bug's rate), else now, before the body is read and parsed."""
    if header:
        try:
            intended = float(header)
        except ValueError:
            return now, False
        if 0.0 <= now - intended <= MAX_LATENESS_S:
            return intended, True
    return now, False


def _parse(
    body: Any,
    engine: LLMEngine,
    model_name: str,
    arrival: float | None = None,
    declared: bool = False,
) -> Request:
    if not isinstance(body, dict):
        raise RequestError("body must be a JSON object")
    model = body.get("model", model_name)
    if model not in (model_name, "", None):
        raise RequestError(f"The model `{model}` does not exist (this server has {model_name})")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if not isinstance(prompt, list):
        raise RequestError(
            "prompt must be a list of token ids (no tokenizer: --skip-tokenizer-init)"
        )
    if body.get("n", 1) != 1:
        raise RequestError("only n=1 is supported")
    temperature = body.get("temperature", 1.0)
    if temperature not in (0, 0.0):
        raise RequestError("only greedy decoding (temperature 0) is supported")
    logprobs = body.get("logprobs") or 0
    max_tokens = body.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or not isinstance(logprobs, int):
        raise RequestError("max_tokens and logprobs must be integers")
    return engine.make_request(prompt, max_tokens, logprobs, arrival, declared)


def _response(request: Request, body: dict[str, Any], created: int, model: str) -> dict[str, Any]:
    as_ids = bool(body.get("return_tokens_as_token_ids"))

    def name(token: int) -> str:
        return f"token_id:{token}" if as_ids else f"<{token}>"

    tokens = [name(o.token_id) for o in request.outputs]
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    choice: dict[str, Any] = {
        "index": 0,
        "text": "".join(tokens),
        "logprobs": None,
        "finish_reason": "length",
        "stop_reason": None,
    }
    if body.get("logprobs") is not None:
        top = []
        for o in request.outputs:
            entry = {name(t): lp for t, lp in o.top}
            entry.setdefault(name(o.token_id), o.logprob)  # vLLM adds the sampled token
            top.append(entry)
        choice["logprobs"] = {
            "text_offset": offsets,
            "token_logprobs": [o.logprob for o in request.outputs],
            "tokens": tokens,
            "top_logprobs": top,
        }
    if body.get("return_token_ids"):
        choice["prompt_token_ids"] = list(request.prompt)
        choice["token_ids"] = [o.token_id for o in request.outputs]
    n_prompt, n_out = len(request.prompt), len(request.outputs)
    return {
        "id": request.request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": n_prompt,
            "total_tokens": n_prompt + n_out,
            "completion_tokens": n_out,
        },
    }


def _metrics(server: ApiServer) -> str:
    running, waiting = server.loop.counts()
    engine = server.loop.engine
    labels = f'engine="0",model_name="{server.model_name}"'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {float(running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {float(waiting)}",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} 0.0",
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{{{labels}}} {float(engine.prefix_hits)}",
        "# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.",
        "# TYPE vllm:iteration_tokens_total histogram",
    ]
    sizes = list(engine.step_sizes)
    cumulative = 0
    for bound, count in zip(STEP_BUCKETS, engine.bucket_counts, strict=False):
        cumulative += count
        lines.append(
            f'vllm:iteration_tokens_total_bucket{{{labels},le="{float(bound)}"}} {cumulative}'
        )
    lines.append(f'vllm:iteration_tokens_total_bucket{{{labels},le="+Inf"}} {len(sizes)}')
    lines.append(f"vllm:iteration_tokens_total_count{{{labels}}} {len(sizes)}")
    lines.append(f"vllm:iteration_tokens_total_sum{{{labels}}} {float(sum(sizes))}")
    # Not vLLM metrics: the demo's device clock (engine.DeviceTiming). Plain counters, so any
    # Prometheus parser reads them. Late arrivals are what lets this machine's speed change how
    # steps form (a probe that sees them says so); overruns only delay the answers.
    loop = server.loop
    lines += [
        "# HELP demollm:late_arrivals_total Requests handed to the engine after a step that "
        "started at or after their arrival had been formed without them.",
        "# TYPE demollm:late_arrivals_total counter",
        f"demollm:late_arrivals_total{{{labels}}} {float(loop.late_arrivals)}",
        "# HELP demollm:arrival_delay_max_seconds Longest time from a declared arrival to the "
        "engine.",
        "# TYPE demollm:arrival_delay_max_seconds gauge",
        f"demollm:arrival_delay_max_seconds{{{labels}}} {loop.max_arrival_delay_s:.6f}",
        "# HELP demollm:step_overruns_total Engine steps whose compute outlasted their modelled "
        "device time.",
        "# TYPE demollm:step_overruns_total counter",
        f"demollm:step_overruns_total{{{labels}}} {float(server.loop.overruns)}",
        "# HELP demollm:step_overrun_seconds_total Seconds by which those steps overran.",
        "# TYPE demollm:step_overrun_seconds_total counter",
        f"demollm:step_overrun_seconds_total{{{labels}}} {server.loop.overrun_s:.6f}",
    ]
    return "\n".join(lines) + "\n"


def _flag_from_env(name: str) -> bool:
    """An environment switch as C's atoi reads it: a non-zero integer is on."""
    value = os.environ.get(name, "").strip()
    digits = value[1:] if value[:1] in "+-" else value
    end = next((i for i, ch in enumerate(digits) if not ch.isdigit()), len(digits))
    return int(digits[:end] or "0") != 0


def batch_invariant_from_env() -> bool:
    """VLLM_BATCH_INVARIANT as the kernels read it (C's atoi: a non-zero integer is on)."""
    return _flag_from_env("VLLM_BATCH_INVARIANT")


def flashinfer_sampler_from_env() -> bool:
    """VLLM_USE_FLASHINFER_SAMPLER: off unless set to a non-zero integer (the demo ships no
    FlashInfer, so its default is vLLM's without it)."""
    return _flag_from_env("VLLM_USE_FLASHINFER_SAMPLER")


def build_engine(
    max_num_seqs: int, max_num_batched_tokens: int, seed: int = 0,
    options: EngineOptions | None = None,
) -> LLMEngine:
    kernels = Kernels()
    model = DemoModel(ModelConfig(seed=seed, batch_invariant=batch_invariant_from_env()), kernels)
    return LLMEngine(model, SchedulerConfig(max_num_seqs, max_num_batched_tokens), options)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m demollm.server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="demo", help="served model name")
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0, help="seed of the model's weights")
    defaults = DeviceTiming()
    parser.add_argument(
        "--step-overhead-ms",
        type=float,
        default=defaults.launch_overhead_ms,
        help="modelled launch overhead of every engine step (0 with --step-per-token-ms 0: "
        "steps last as long as the CPU takes)",
    )
    parser.add_argument(
        "--step-per-token-ms",
        type=float,
        default=defaults.per_token_ms,
        help="modelled cost of each token in a step",
    )
    parser.add_argument(
        "--admission-lag-ms",
        type=float,
        default=defaults.admission_lag_ms,
        help="how far the device runs behind real time for clients that declare their "
        "requests' arrival (X-Bisect-Arrival): the longest hand-over that still joins its step",
    )
    # As vLLM: CUDA graphs (and their warm-up, engine.WARMUP_STEPS) unless --enforce-eager.
    parser.add_argument("--enforce-eager", action="store_true",
                        help="no CUDA graphs: no warm-up path for the first steps after start")
    # Off by default, unlike vLLM: the demo recipes' workloads were calibrated without it.
    caching = parser.add_mutually_exclusive_group()
    caching.add_argument("--enable-prefix-caching", dest="prefix_caching", action="store_true",
                         default=False, help="reuse the running sums of cached prompt blocks")
    caching.add_argument("--no-enable-prefix-caching", dest="prefix_caching",
                         action="store_false")
    parser.add_argument(
        "--crowd-ms",
        type=float,
        default=0.0,
        help="modelled cost of each request's hand-over to the engine for every other demo "
        "server on this device (DEMOLLM_DEVICE_DIR lists them; 0: no crowding)",
    )
    # Accepted for command-line compatibility with vLLM recipes; the demo has no tokenizer.
    # (The tool tells servers sharing a GPU their KV cache size and memory share.)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)
    parser.add_argument("--skip-tokenizer-init", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(message)s")
    options = EngineOptions(
        warmup_steps=0 if args.enforce_eager else WARMUP_STEPS,
        flashinfer_sampler=flashinfer_sampler_from_env(),
        prefix_caching=args.prefix_caching,
    )
    try:
        engine = build_engine(args.max_num_seqs, args.max_num_batched_tokens, args.seed, options)
    except KernelsUnavailable as exc:
        logger.error("cannot load the compiled ops: %s", exc)
        return 1
    try:
        timing = DeviceTiming(args.step_overhead_ms, args.step_per_token_ms, args.admission_lag_ms)
    except ValueError as exc:
        logger.error("bad step timing: %s", exc)
        return 2
    kernels = engine.model.kernels
    logger.info(
        "Initializing a V1 LLM engine (v%s) with config: model=%r, max_num_seqs=%d, "
        "max_num_batched_tokens=%d, vocab_size=%d, hidden_size=%d, kernels=%s, "
        "kernels_sha256=%s, rms_norm_block_size(<256 tokens)=%s, (>=256 tokens)=%s, "
        "batch_invariant_matmul=%s, step_time=%.3f ms + %.4f ms/token, admission_lag=%.1f ms, "
        "cuda_graphs=%s (warm-up steps %d), flashinfer_sampler=%s, prefix_caching=%s",
        __version__,
        args.model,
        args.max_num_seqs,
        args.max_num_batched_tokens,
        engine.model.config.vocab_size,
        engine.model.config.hidden_size,
        kernels.path,
        kernels.sha256,
        kernels.block_size(1, engine.model.config.hidden_size),
        kernels.block_size(256, engine.model.config.hidden_size),
        engine.model.config.batch_invariant,
        timing.launch_overhead_ms,
        timing.per_token_ms,
        timing.admission_lag_ms,
        not args.enforce_eager,
        options.warmup_steps,
        options.flashinfer_sampler,
        options.prefix_caching,
    )
    loop = EngineLoop(engine, timing)
    loop.start()
    peers = Peers(os.environ.get("DEMOLLM_DEVICE_DIR", ""),
                  os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    handover = HandOver(args.crowd_ms, peers) if args.crowd_ms > 0 else None
    if handover is not None:
        logger.info("crowding: %.1f ms a request for every other server on device %r",
                    args.crowd_ms, os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    server = ApiServer((args.host, args.port), loop, args.model, handover)
    host, port = server.server_address[:2]
    stopping = threading.Event()

    def shut_down(signum: int, frame: Any) -> None:
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shut_down)
    signal.signal(signal.SIGINT, shut_down)
    logger.info("Starting vLLM API server 0 on http://%s:%d", host, port)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
        loop.stop()
        peers.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
