"""The embedded teacher server: an OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1 that
samples every request from its own seeded generator.

    python -m ops.teacher.serve --model-dir .models/SmolLM2-135M-Instruct --port 8000 [--max-batch 16]

Why not ``transformers serve``: it applies a request's ``seed`` with a global ``torch.manual_seed``
and, with continuous batching, samples every sequence of a batch from the global generator, so
concurrent requests draw from each other's random stream and the same seeded request returns a
different text depending on what ran beside it. Here each request gets a ``torch.Generator`` of
its own, seeded with its ``seed`` (the OpenAI ``seed`` field), and a row's token is drawn from its
generator alone; the response says ``"seed_honoured": true`` and carries a ``system_fingerprint``
(model files, dtype, library versions) as the OpenAI spec advises (docs/curation.md, "Seeded
distillation").

Batching: each prompt is prefilled alone, then concurrent requests are decoded together (their
caches left-padded into one, finished rows dropped), up to ``--max-batch`` rows; a request arriving
while a batch runs waits for the next.
Float arithmetic is not batch-invariant (a row's logits depend on the batch shape: ~3e-5 in
float32 on this model), which would flip a sampled token with probability ~1e-5 per token; the
default ``--dtype float64`` brings that to ~1e-13, so the same seed gives the same text whatever
ran beside it. Decoding at 16 rows runs ~67 tokens/s in float64 vs ~120 in float32 on 2 cores
(greedy decode loop, no HTTP).

Sampling per request: ``temperature`` (0 = greedy), ``top_p``, the model's ``top_k``
(generation_config.json, default 50), ``max_tokens`` / ``max_completion_tokens`` (default 1024);
``n`` > 1, ``stream`` and non-text content are refused with HTTP 400. Stops at an EOS token.

It runs as its own process (``python -m ops.teacher.serve``): the port is bound at once, ``/health``
answers 503 until the model is loaded, then 200; ``GET /v1/teacher`` reports the instance id given
on the command line (so a launcher can tell its own server from another on the same port), the
fingerprint and ``"seed_honoured": true``.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import os
import queue
import secrets
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ops.httpjson import send_json

SERVER_VERSION = "1"
DEFAULT_MAX_TOKENS = 1024


class BadRequest(ValueError):
    """A request the server refuses (HTTP 400; the message names the field)."""


@dataclass
class Job:
    """One chat completion in the scheduler: the prompt's token ids and its sampling settings."""

    prompt_ids: list[int]
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    seed: int | None
    done: threading.Event = field(default_factory=threading.Event)
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str = "length"
    error: str | None = None


def parse_body(body: dict, defaults: dict) -> dict:
    """Sampling settings of a chat-completions body: temperature, top_p, top_k, max_new_tokens, seed.

    Raises:
        BadRequest: a field of the wrong type or range, or an unsupported option (named).
    """
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise BadRequest("'messages' must be a non-empty list")
    for i, m in enumerate(body["messages"]):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise BadRequest(f"messages[{i}] must have a string 'role' and a string 'content'")
    if body.get("stream"):
        raise BadRequest("'stream' is not supported by the embedded teacher")
    if body.get("n", 1) != 1:
        raise BadRequest("'n' must be 1 (send one request per sample, each with its own seed)")

    def num(name, default, lo, hi, kind=float):
        v = body.get(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
            raise BadRequest(f"'{name}' must be a number" if kind is float else f"'{name}' must be an integer")
        if not lo <= v <= hi:
            raise BadRequest(f"'{name}' must be in [{lo}, {hi}], got {v}")
        return kind(v)

    tokens_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return {
        "temperature": num("temperature", defaults["temperature"], 0.0, 100.0),
        "top_p": num("top_p", defaults["top_p"], 0.0, 1.0),
        "top_k": defaults["top_k"],
        "max_new_tokens": num(tokens_field, DEFAULT_MAX_TOKENS, 1, 1 << 20, int),
        "seed": num("seed", None, 0, (1 << 64) - 1, int),
    }


def sample_token(logits, temperature: float, top_p: float, top_k: int, generator) -> int:
    """Draw one token id from a row's logits ``[vocab]`` with the row's own ``generator``.

    Temperature 0 is greedy (argmax). Otherwise logits / temperature, keep the ``top_k`` highest
    (0 = all), then the smallest set whose probability reaches ``top_p``, renormalise, draw.
    """
    import torch

    if temperature == 0.0:
        return int(torch.argmax(logits))
    scores = logits / temperature
    if 0 < top_k < scores.numel():
        kth = torch.topk(scores, top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        cum = torch.softmax(sorted_scores, dim=-1).cumsum(-1)
        drop = cum - torch.softmax(sorted_scores, dim=-1) >= top_p  # keep the first token always
        scores = scores.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


class Engine:
    """The model, its tokenizer and the batched decode loop.

    Args:
        model_dir: a Hugging Face model directory (config.json, weights, tokenizer).
        dtype: ``float64`` (default: samples independent of the batch) or ``float32``.
        threads: torch intra-op threads (0 = torch's default).
    """

    def __init__(self, model_dir: str | Path, dtype: str = "float64", threads: int = 0):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        if threads > 0:
            torch.set_num_threads(threads)
        self.model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self.model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=getattr(torch, dtype)).eval()
        try:
            gen = GenerationConfig.from_pretrained(str(self.model_dir))
        except OSError:
            gen = GenerationConfig()
        self.defaults = {"temperature": float(gen.temperature if gen.temperature is not None else 1.0),
                         "top_p": float(gen.top_p if gen.top_p is not None else 1.0),
                         "top_k": int(gen.top_k if gen.top_k is not None else 0)}
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tokenizer.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.pad = gen.pad_token_id if gen.pad_token_id is not None else (self.tokenizer.pad_token_id or 0)
        h = hashlib.sha256()
        for name in ("config.json", "generation_config.json"):
            p = self.model_dir / name
            h.update(p.read_bytes() if p.exists() else b"")
        for p in sorted(self.model_dir.glob("*.safetensors")):
            h.update(f"{p.name}:{p.stat().st_size}".encode())
        h.update(f"{dtype}:{torch.__version__}:{transformers.__version__}:{SERVER_VERSION}".encode())
        self.fingerprint = f"crucible-embedded-{h.hexdigest()[:12]}"

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        return list(ids["input_ids"])

    def run(self, jobs: list[Job]) -> None:
        """Decode ``jobs`` together; fills each job's output_ids and finish_reason.

        Each prompt is prefilled alone (no padding to the longest prompt: the prefill costs its own
        tokens only, and a row's prompt cache never depends on the batch), then the per-row caches
        are left-padded into one and decoded together, finished rows dropped.
        """
        import torch
        from transformers import DynamicCache

        gens, first, caches = [], [], []
        with torch.inference_mode():
            for j in jobs:
                g = torch.Generator()
                g.manual_seed(j.seed if j.seed is not None else secrets.randbits(63))
                gens.append(g)
                out = self.model(input_ids=torch.tensor([j.prompt_ids]), past_key_values=DynamicCache(), use_cache=True)
                first.append(sample_token(out.logits[0, -1, :], j.temperature, j.top_p, j.top_k, g))
                caches.append([(layer.keys, layer.values) for layer in out.past_key_values.layers])
        width = max(len(j.prompt_ids) for j in jobs)

        def left_pad(t, n):  # [1, heads, seq, dim] -> [1, heads, seq + n, dim], zeros first (masked)
            return torch.cat([t.new_zeros(t.shape[0], t.shape[1], n, t.shape[3]), t], dim=2) if n else t

        pads = [width - len(j.prompt_ids) for j in jobs]
        cache = DynamicCache(ddp_cache_data=[
            (torch.cat([left_pad(c[n][0], pad) for c, pad in zip(caches, pads)]),
             torch.cat([left_pad(c[n][1], pad) for c, pad in zip(caches, pads)]))
            for n in range(len(caches[0]))])
        del caches
        mask = torch.tensor([[0] * pad + [1] * len(j.prompt_ids) for j, pad in zip(jobs, pads)])
        pos = torch.tensor([[len(j.prompt_ids) - 1] for j in jobs])
        live, nxt, keep = list(range(len(jobs))), [], []
        for row, (j, tok) in enumerate(zip(jobs, first)):
            if self._take(j, tok):
                keep.append(row)
                nxt.append(tok)
        with torch.inference_mode():
            while True:
                if not keep:
                    break
                if len(keep) < len(live):
                    idx = torch.tensor(keep)
                    cache.batch_select_indices(idx)
                    mask, pos = mask[idx], pos[idx]
                live = [live[r] for r in keep]
                ids = torch.tensor(nxt).unsqueeze(-1)
                pos = pos + 1
                mask = torch.cat([mask, torch.ones(len(live), 1, dtype=mask.dtype)], dim=-1)
                out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                logits = out.logits[:, -1, :]
                nxt, keep = [], []
                for row, n in enumerate(live):
                    j = jobs[n]
                    tok = sample_token(logits[row], j.temperature, j.top_p, j.top_k, gens[n])
                    if self._take(j, tok):
                        keep.append(row)
                        nxt.append(tok)

    def _take(self, job: Job, tok: int) -> bool:
        """Append a sampled token; False when the job is finished (EOS or max_new_tokens)."""
        if tok in self.eos:
            job.finish_reason = "stop"
            return False
        job.output_ids.append(tok)
        if len(job.output_ids) >= job.max_new_tokens:
            job.finish_reason = "length"
            return False
        return True


class Scheduler:
    """One worker thread: takes the waiting jobs (up to ``max_batch``) and decodes them together."""

    def __init__(self, engine: Engine, max_batch: int = 16, gather_s: float = 0.05):
        self.engine = engine
        self.max_batch = max(1, max_batch)
        self.gather_s = gather_s
        self.jobs: queue.Queue[Job] = queue.Queue()
        threading.Thread(target=self._loop, name="teacher-decode", daemon=True).start()

    def submit(self, job: Job) -> Job:
        self.jobs.put(job)
        job.done.wait()
        return job

    def _loop(self) -> None:
        while True:
            batch = [self.jobs.get()]
            deadline = time.monotonic() + self.gather_s
            while len(batch) < self.max_batch:
                try:
                    batch.append(self.jobs.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            try:
                self.engine.run(batch)
            except Exception as e:  # reported to each caller as HTTP 500
                for j in batch:
                    j.error = f"{type(e).__name__}: {e}"[:500]
            for j in batch:
                j.done.set()


class Served:
    """What the HTTP handlers serve: None until the model is loaded (then 503 is answered)."""

    def __init__(self, model_dir: Path, instance: str = ""):
        self.model_dir = model_dir
        self.instance = instance
        self.engine: Engine | None = None
        self.scheduler: Scheduler | None = None

    def load(self, engine: Engine, max_batch: int) -> None:
        self.scheduler = Scheduler(engine, max_batch=max_batch)
        self.engine = engine


def make_server(served: Served, host: str, port: int) -> ThreadingHTTPServer:
    """The HTTP server: ``GET /health``, ``GET /v1/teacher``, ``GET /v1/models``,
    ``POST /v1/chat/completions``. Binds ``host:port`` at once (OSError when taken)."""
    model_name = str(served.model_dir)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, code: int, obj: dict) -> None:
            send_json(self, code, obj)

        def _error(self, code: int, message: str) -> None:
            self._send(code, {"error": {"message": message, "type": "invalid_request_error" if code == 400 else "server_error"}})

        def do_GET(self):
            if self.path == "/health":
                return self._send(200, {"status": "ok"}) if served.engine else self._send(503, {"status": "loading"})
            if self.path == "/v1/teacher":
                return self._send(200, {"instance": served.instance, "model": model_name, "seed_honoured": True,
                                        "system_fingerprint": served.engine.fingerprint if served.engine else None})
            if self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "local"}]})
            self._error(404, f"no route {self.path}")

        def do_POST(self):
            try:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            except (ValueError, OSError):
                return self._error(400, "unreadable request body")
            if self.path != "/v1/chat/completions":
                return self._error(404, f"no route {self.path}")
            engine, scheduler = served.engine, served.scheduler
            if engine is None or scheduler is None:
                return self._error(503, "the model is still loading")
            try:
                body = json.loads(raw or b"{}")
                if not isinstance(body, dict):
                    raise BadRequest("the request body must be a JSON object")
                settings = parse_body(body, engine.defaults)
                prompt = engine.prompt_ids([{"role": m["role"], "content": m["content"]} for m in body["messages"]])
            except (BadRequest, json.JSONDecodeError) as e:
                return self._error(400, str(e))
            job = scheduler.submit(Job(prompt, **settings))
            if job.error:
                return self._error(500, job.error)
            text = engine.tokenizer.decode(job.output_ids, skip_special_tokens=True)
            self._send(200, {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model") or model_name, "system_fingerprint": engine.fingerprint,
                "seed_honoured": job.seed is not None,
                "choices": [{"index": 0, "finish_reason": job.finish_reason,
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(job.output_ids),
                          "total_tokens": len(prompt) + len(job.output_ids)},
            })

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def watch_parent(parent_pid: int, every_s: float = 0.5) -> threading.Thread:
    """A daemon thread that ends this process (``os._exit(0)``) within ``every_s`` seconds of its
    parent ``parent_pid`` dying (this process is then re-parented). Unlike ``PR_SET_PDEATHSIG``, which
    fires when the parent *thread* that started it exits, it follows the parent process: a server
    that a Dagster run shares between steps outlives the short-lived thread that happened to start it,
    and a killed run leaves no server behind."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(every_s)
        print(f"teacher server: parent process {parent_pid} is gone; exiting", file=sys.stderr, flush=True)
        os._exit(0)

    t = threading.Thread(target=watch, name="teacher-parent-watch", daemon=True)
    t.start()
    return t


def main(argv=None) -> int:
    """``python -m ops.teacher.serve --model-dir DIR [--host H --port P ...]``: serve until killed
    (what ``ops.teacher.server.LocalTeacherServer`` starts). Returns 0."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True, type=Path)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-batch", type=int, default=16, help="rows decoded together (1 = one request at a time)")
    ap.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = default)")
    ap.add_argument("--instance-id", default="", help="reported by GET /v1/teacher (the launcher's check)")
    ap.add_argument("--parent-pid", type=int, default=0,
                    help="exit when this process is no longer this server's parent (it died); 0 = serve until killed")
    args = ap.parse_args(argv)
    faulthandler.enable()  # a crash in native code leaves a traceback in the log
    if args.parent_pid:
        watch_parent(args.parent_pid)
    if not (args.model_dir / "config.json").exists():
        print(f"model directory {args.model_dir} has no config.json", file=sys.stderr)
        return 2
    served = Served(args.model_dir, args.instance_id)
    server = make_server(served, args.host, args.port)  # claim the port before the slow model load
    thread = threading.Thread(target=server.serve_forever, name="teacher-http", daemon=True)
    thread.start()
    try:
        engine = Engine(args.model_dir, dtype=args.dtype, threads=args.threads)
        served.load(engine, args.max_batch)
        print(f"teacher serving {args.model_dir} on http://{args.host}:{args.port}/v1 ({args.dtype}, "
              f"max batch {args.max_batch}, fingerprint {engine.fingerprint})", flush=True)
        thread.join()
    finally:
        server.shutdown()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
