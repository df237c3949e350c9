"""Real HTTP servers on loopback that speak the slice of vLLM's API the server probe uses.

``POST /v1/completions`` (token-id prompts, greedy, logprobs with ``return_tokens_as_token_ids``),
``GET /v1/models``, ``GET /health`` and ``GET /metrics`` with a truthful
``vllm:num_requests_running`` gauge: it counts requests being worked on right now, and each is
held ``hold_s`` so concurrent requests overlap as they do in an engine step. Behaviours:

- deterministic: the output is a pure function of the prompt (the CLEAN lifetime);
- ``perturb_passes``: in those passes (0 = the priming pass) a request that overlapped another
  gets one logprob moved by one ulp (``math.nextafter``): divergence only under concurrency;
- ``serialize``: one request worked on at a time, the rest wait (the batch never forms);
- ``drop_at``: the N-th completion's connection is closed without a response, once;
- ``die_at``: the N-th completion kills the server (listener and every open connection).

Run as a script (``python tests/probe_servers.py``) it serves in the foreground and prints its
URL: the benchmark uses that so the server's CPU time is not the client's.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "test-model"


@dataclass
class Behaviour:
    hold_s: float = 0.1
    vocab: int = 50_000
    serialize: bool = False
    # Like an engine admitting a batch: a request waits until this many are running (or no
    # request has arrived for gather_quiet_s), then is held hold_s. Keeps the batch visible to
    # a 20 ms /metrics poll even when the test machine is busy and arrivals spread out.
    gather: int = 0
    gather_quiet_s: float = 0.05
    workload_size: int = 1  # completions per pass, to tell passes apart
    perturb_passes: frozenset[int] = frozenset()
    perturb_position: int = 2
    drop_at: int | None = None
    die_at: int | None = None
    # False models the invariance switch off: every odd pass that overlapped moves a bit, so
    # repeats of a concurrent workload disagree (the positive control's server).
    invariant: bool = True

    def perturbs(self, pass_index: int) -> bool:
        return pass_index % 2 == 1 if not self.invariant else pass_index in self.perturb_passes


@dataclass
class State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    engine: threading.Lock = field(default_factory=threading.Lock)  # serialize mode
    running: int = 0
    waiting: int = 0
    max_running: int = 0
    arrivals: int = 0
    last_arrival: float = 0.0
    completions: int = 0
    dropped: int = 0
    dead: bool = False
    bodies: list[bytes] = field(default_factory=list)
    sockets: set[socket.socket] = field(default_factory=set)


def output_for(prompt: list[int], max_tokens: int, k: int, vocab: int) -> dict[str, Any]:
    """A deterministic completion: every token and logprob is a pure function of the prompt."""
    seed = hashlib.sha256(json.dumps(prompt).encode()).digest()
    ids: list[int] = []
    chosen: list[float] = []
    tops: list[dict[str, float]] = []
    for pos in range(max_tokens):
        h = hashlib.sha256(seed + struct.pack("<I", pos)).digest()
        cands = [int.from_bytes(h[4 * i : 4 * i + 4], "little") % vocab for i in range(k)]
        lps = sorted(
            (
                -(int.from_bytes(h[20 + 2 * i : 22 + 2 * i], "little") + 1) / 7919.0
                for i in range(k)
            ),
            reverse=True,
        )
        ids.append(cands[0])
        chosen.append(lps[0])
        tops.append({f"token_id:{c}": lp for c, lp in zip(cands, lps, strict=True)})
    return {"ids": ids, "chosen": chosen, "tops": tops}


def _check_body(body: dict[str, Any]) -> str:
    """What vLLM would reject (400), for the fields the probe relies on."""
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
        return "prompt must be a list of token ids"
    if body.get("model") != MODEL:
        return f"model {body.get('model')!r} does not exist"
    if body.get("temperature") != 0 or not isinstance(body.get("logprobs"), int):
        return "expected greedy sampling with logprobs"
    if body.get("return_tokens_as_token_ids") is not True:
        return "expected return_tokens_as_token_ids"
    return ""


def make_handler(b: Behaviour, st: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn serves vLLM
        # Buffered: headers and body leave in one write (flushed after each request), so
        # Nagle's algorithm never holds the body back for a delayed ACK (~40 ms per response).
        wbufsize = 1 << 16

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            with st.lock:
                st.sockets.add(self.connection)

        def finish(self) -> None:
            with st.lock:
                st.sockets.discard(self.connection)
            with contextlib.suppress(OSError):
                super().finish()

        def _send(self, code: int, payload: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:
            if st.dead:
                self.close_connection = True
                return
            if self.path == "/health":
                self._send(200, b"")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode())
            elif self.path == "/metrics":
                with st.lock:
                    running, waiting = st.running, st.waiting
                text = (
                    "# HELP vllm:num_requests_running Number of requests in model execution.\n"
                    "# TYPE vllm:num_requests_running gauge\n"
                    f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} {running}.0\n'
                    f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} {waiting}.0\n'
                )
                self._send(200, text.encode(), "text/plain; version=0.0.4")
            elif self.path == "/stats":
                with st.lock:
                    stats = {
                        "max_running": st.max_running,
                        "completions": st.completions,
                        "arrivals": st.arrivals,
                        "dropped": st.dropped,
                    }
                self._send(200, json.dumps(stats).encode())
            else:
                self._send(404, b'{"detail":"Not Found"}')

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            if st.dead or self.path != "/v1/completions":
                self.close_connection = True
                if not st.dead:
                    self._send(404, b'{"detail":"Not Found"}')
                return
            with st.lock:
                index = st.arrivals
                st.arrivals += 1
                st.last_arrival = time.monotonic()
                st.bodies.append(raw)
            if b.die_at is not None and index == b.die_at:
                kill(st)
                self.close_connection = True
                return
            if b.drop_at is not None and index == b.drop_at:
                st.dropped += 1
                self.close_connection = True  # the connection closes with no response
                return
            body = json.loads(raw)
            problem = _check_body(body)
            if problem:
                self._send(400, json.dumps({"error": {"message": problem}}).encode())
                return
            overlapped = self._work()
            if st.dead:
                self.close_connection = True
                return
            out = output_for(body["prompt"], body["max_tokens"], body["logprobs"], b.vocab)
            pass_index = index // max(b.workload_size, 1)
            moved = overlapped and b.perturbs(pass_index)
            if moved and b.perturb_position < len(out["chosen"]):
                p = b.perturb_position
                old = out["chosen"][p]
                new = math.nextafter(old, -math.inf)  # one ulp: the last bit of the double
                out["chosen"][p] = new
                key = f"token_id:{out['ids'][p]}"
                out["tops"][p] = {k: (new if k == key else v) for k, v in out["tops"][p].items()}
            choice: dict[str, Any] = {
                "index": 0,
                "text": "",
                "finish_reason": "length",
                "logprobs": {
                    "tokens": [f"token_id:{i}" for i in out["ids"]],
                    "token_logprobs": out["chosen"],
                    "top_logprobs": out["tops"],
                    "text_offset": [0] * len(out["ids"]),
                },
            }
            if body.get("return_token_ids"):
                choice["token_ids"] = out["ids"]
                choice["prompt_token_ids"] = body["prompt"]
            with st.lock:
                st.completions += 1
            self._send(
                200,
                json.dumps(
                    {"object": "text_completion", "model": MODEL, "choices": [choice]}
                ).encode(),
            )

        def _work(self) -> bool:
            """Hold the request like an engine step would; True when another request overlapped."""
            if b.serialize:
                with st.lock:
                    st.waiting += 1
                with st.engine:
                    with st.lock:
                        st.waiting -= 1
                    return self._run_one()
            return self._run_one()

        def _run_one(self) -> bool:
            with st.lock:
                st.running += 1
                st.max_running = max(st.max_running, st.running)
                peak = st.running
            while b.gather and peak < b.gather and not st.dead:
                if time.monotonic() - st.last_arrival > b.gather_quiet_s:
                    break
                time.sleep(0.002)
                with st.lock:
                    peak = max(peak, st.running)
            deadline = time.monotonic() + b.hold_s
            while (left := deadline - time.monotonic()) > 0:
                time.sleep(min(left, 0.002))
                with st.lock:
                    peak = max(peak, st.running)
            with st.lock:
                st.running -= 1
            return peak > 1

    return Handler


def kill(st: State) -> None:
    """Like an engine crash: no new connections, every open connection reset."""
    st.dead = True
    with st.lock:
        socks = list(st.sockets)
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default backlog of 5 would drop a 44-request burst's SYNs


@dataclass
class Running:
    url: str
    state: State
    server: _Server

    def is_alive(self) -> bool:
        return not self.state.dead


@contextlib.contextmanager
def serve(behaviour: Behaviour | None = None) -> Iterator[Running]:
    """A server on 127.0.0.1 (an ephemeral port) for the duration of the block."""
    b = behaviour or Behaviour()
    st = State()
    server = _Server(("127.0.0.1", 0), make_handler(b, st))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    watcher = threading.Thread(target=_close_when_dead, args=(server, st), daemon=True)
    watcher.start()
    try:
        yield Running(url=f"http://127.0.0.1:{server.server_address[1]}", state=st, server=server)
    finally:
        st.dead = True
        server.shutdown()
        server.server_close()
        kill(st)
        thread.join(timeout=5)


def _close_when_dead(server: _Server, st: State) -> None:
    # A dead server must refuse connections (the probe's "connection refused" path), so the
    # listener closes as soon as the state says dead.
    while not st.dead:
        time.sleep(0.01)
    server.shutdown()
    server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hold-ms", type=float, default=20.0)
    args = parser.parse_args()
    with serve(Behaviour(hold_s=args.hold_ms / 1000.0)) as running:
        print(running.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            sys.stdin.read()  # serve until stdin closes (the parent exits or closes the pipe)


if __name__ == "__main__":
    main()
