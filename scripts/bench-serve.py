#!/usr/bin/env python3
"""Serving figures for issue 29: `ferrite serve` against llama.cpp's own
OpenAI-compatible server (`llama-cpp-python[server]`, `python -m
llama_cpp.server`) on the same `.gguf`, at 1, 4, 16 and 64 concurrent
streams over loopback.

    .venv/bin/python scripts/bench-serve.py [--concurrency 1,4,16,64]
        [--max-tokens 32] [--targets ferrite,llama.cpp] [--device local-task]
        [--ferrite-bin target/release/ferrite] [--ferrite-flag=--batch_module=P]
        [--out build/bench-serve]

Each level runs max(c, --min-requests) streaming completions (greedy, one
of four fixed story prompts each) from c client threads, and reports:

- aggregate tokens/s: streamed tokens of all requests / the level's wall
  time (first request sent to last stream ended; prefills included);
- time to first token (request sent to first text chunk), p50 and p99;
- inter-token latency (gaps between consecutive text chunks of one
  stream), p50 and p99.

Tokens are counted as text chunks (both servers send one chunk per
generated token). Greedy outputs are checked: every stream of one prompt
must produce the same text at every concurrency level (batching must not
mix sequences); a target whose outputs differ is marked in the JSON and
the table.

Writes OUT.json and OUT.png (matplotlib, pip-installed into this
interpreter's environment when missing; so is llama-cpp-python[server],
which builds from source: ~10 minutes on 2 cores). Servers listen on
127.0.0.1 only.
"""

import argparse
import http.client
import json
import os
import platform
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "llm"))
import assets  # noqa: E402

PROMPTS = [
    "Write a long story about a dragon who lives in a castle. Once upon a time,",
    "Here is a detailed history of the Roman Empire. In the beginning,",
    "The following is a long essay about the ocean and its creatures. The ocean",
    "A travel diary of a journey across the mountains. Day one: we set out",
]


def ensure_module(module, requirement):
    try:
        __import__(module)
    except ImportError:
        print(f"bench-serve: pip install {requirement} (into {sys.prefix})", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", requirement], check=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process; `url` once it answers `ready_path` with 200."""

    def __init__(self, name, cmd, url=None, ready_path="/v1/models", timeout=300):
        self.name = name
        self.log = []
        self.url = url
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        found = threading.Event()

        def pump():
            for line in self.proc.stdout:
                self.log.append(line)
                m = re.search(r"listening on (http://[0-9.:]+)", line)
                if m and not self.url:
                    self.url = m.group(1)
                    found.set()
            found.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({self.proc.returncode}):\n{''.join(self.log[-30:])}")
            if self.url:
                try:
                    if request(self.url, "GET", ready_path)[0] == 200:
                        return
                except OSError:
                    pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"{name} did not become ready in {timeout} s:\n{''.join(self.log[-30:])}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def connect(url, timeout):
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


def request(url, method, path, body=None, timeout=30):
    conn = connect(url, timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"content-type": "application/json"} if data else {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def stream_completion(url, model, prompt, max_tokens, timeout=900):
    """One streaming greedy completion: (text, send time, chunk times)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    conn = connect(url, timeout)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body=json.dumps(body).encode(), headers={"content-type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
        text, times = [], []
        while True:
            line = r.readline()
            if not line:
                break
            line = line.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            choices = chunk.get("choices") or [{}]
            piece = choices[0].get("text") or ""
            if piece:
                times.append(time.perf_counter())
                text.append(piece)
        return "".join(text), t0, times
    finally:
        conn.close()


def percentile(values, p):
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def run_level(url, model, c, n_requests, max_tokens):
    jobs = [PROMPTS[i % len(PROMPTS)] for i in range(n_requests)]
    lock = threading.Lock()
    results = []

    def worker(w):
        for i in range(w, n_requests, c):
            out = stream_completion(url, model, jobs[i], max_tokens)
            with lock:
                results.append((jobs[i], *out))

    start = time.perf_counter()
    with ThreadPoolExecutor(c) as pool:
        list(pool.map(worker, range(c)))
    wall = time.perf_counter() - start
    tokens = sum(len(times) for _, _, _, times in results)
    ttft = [times[0] - t0 for _, _, t0, times in results if times]
    itl = [b - a for _, _, _, times in results for a, b in zip(times, times[1:])]
    texts = {}
    for prompt, text, _, _ in results:
        texts.setdefault(prompt, set()).add(text)
    return {
        "concurrency": c,
        "requests": n_requests,
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "ttft_p50_ms": percentile(ttft, 50) * 1e3,
        "ttft_p99_ms": percentile(ttft, 99) * 1e3,
        "itl_p50_ms": (percentile(itl, 50) or 0) * 1e3,
        "itl_p99_ms": (percentile(itl, 99) or 0) * 1e3,
        "texts": {p: sorted(t) for p, t in texts.items()},
    }


def bench_target(name, server, model, levels, args):
    # One unmeasured request first (first-call costs: page faults, caches).
    stream_completion(server.url, model, PROMPTS[0], 4)
    rows = []
    for c in levels:
        n = max(c, args.min_requests)
        print(f"bench-serve: {name}: {c} concurrent streams, {n} requests x {args.max_tokens} tokens", file=sys.stderr)
        rows.append(run_level(server.url, model, c, n, args.max_tokens))
        r = rows[-1]
        print(
            f"  {r['tokens_per_s']:.1f} tok/s, TTFT p50 {r['ttft_p50_ms']:.0f} ms p99 {r['ttft_p99_ms']:.0f} ms, "
            f"ITL p50 {r['itl_p50_ms']:.1f} ms p99 {r['itl_p99_ms']:.1f} ms",
            file=sys.stderr,
        )
    # Greedy outputs: one text per prompt across every level.
    per_prompt = {}
    for r in rows:
        for p, ts in r["texts"].items():
            per_prompt.setdefault(p, set()).update(ts)
    consistent = all(len(ts) == 1 for ts in per_prompt.values())
    for r in rows:
        del r["texts"]
    return {"levels": rows, "greedy_outputs_consistent": consistent, "texts": {p: sorted(t) for p, t in per_prompt.items()}}


def start_ferrite(args, gguf):
    exe = Path(args.ferrite_bin)
    if not exe.exists():
        sys.exit(f"bench-serve: {exe} is missing: cargo build --release -p ferrite-cli (or pass --ferrite-bin)")
    cmd = [str(exe), "serve", f"--gguf={gguf}", "--port=0", f"--device={args.device}", "--max_queue=1024"]
    cmd += args.ferrite_flag
    return Server("ferrite", cmd, ready_path="/health"), Path(gguf).name.removesuffix(".gguf")


def start_llama_cpp(args, gguf):
    ensure_module("llama_cpp", "llama-cpp-python[server]")
    ensure_module("uvicorn", "llama-cpp-python[server]")
    port = free_port()
    threads = args.llama_threads or os.cpu_count()
    cmd = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
        "--port", str(port), "--n_ctx", "2048", "--n_threads", str(threads), "--n_threads_batch", str(threads),
        # By default a new request interrupts the stream in progress; a
        # server under concurrent load must queue them instead.
        "--interrupt_requests", "False",
    ]
    return Server("llama.cpp", cmd, url=f"http://127.0.0.1:{port}"), str(gguf)


def plot(results, levels, path):
    ensure_module("matplotlib", "matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for name, res in results.items():
        rows = res["levels"]
        cs = [r["concurrency"] for r in rows]
        axes[0].plot(cs, [r["tokens_per_s"] for r in rows], marker="o", label=name)
        axes[1].plot(cs, [r["ttft_p50_ms"] for r in rows], marker="o", label=f"{name} p50")
        axes[1].plot(cs, [r["ttft_p99_ms"] for r in rows], marker="x", linestyle="--", label=f"{name} p99")
        axes[2].plot(cs, [r["itl_p50_ms"] for r in rows], marker="o", label=f"{name} p50")
        axes[2].plot(cs, [r["itl_p99_ms"] for r in rows], marker="x", linestyle="--", label=f"{name} p99")
    for ax, title, unit in [
        (axes[0], "aggregate tokens/s", "tokens/s"),
        (axes[1], "time to first token", "ms"),
        (axes[2], "inter-token latency", "ms"),
    ]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels)
        ax.set_xticklabels([str(c) for c in levels])
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    fig.suptitle("OpenAI-compatible serving, SmolLM2-135M Q4_1 (loopback)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", help="the model (default: the SmolLM2 .gguf from examples/llm/assets.py)")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--min-requests", type=int, default=4, help="requests per level at least (default 4)")
    ap.add_argument("--targets", default="ferrite,llama.cpp")
    ap.add_argument("--device", default="local-task", help="Ferrite's device")
    ap.add_argument(
        "--ferrite-flag",
        action="append",
        default=[],
        help="an extra flag for `ferrite serve` (repeatable), e.g. --ferrite-flag=--batch_module=PATH for cuda",
    )
    ap.add_argument("--ferrite-bin", default=str(ROOT / "target" / "release" / "ferrite"))
    ap.add_argument("--llama-threads", type=int, default=0, help="llama.cpp threads (default: all cores)")
    ap.add_argument("--out", default=str(ROOT / "build" / "bench-serve"))
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    gguf = Path(args.gguf) if args.gguf else assets.ensure()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    results = {}
    for target in args.targets.split(","):
        start = {"ferrite": start_ferrite, "llama.cpp": start_llama_cpp}.get(target)
        if start is None:
            sys.exit(f"bench-serve: unknown target '{target}' (ferrite, llama.cpp)")
        server, model = start(args, gguf)
        try:
            results[target] = bench_target(target, server, model, levels, args)
        finally:
            server.stop()

    doc = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "gguf": Path(gguf).name,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "ferrite_device": args.device,
        "max_tokens": args.max_tokens,
        "results": results,
    }
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    plot(results, levels, out.with_suffix(".png"))

    print("| server | streams | requests | tokens/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | greedy outputs consistent |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, res in results.items():
        for r in res["levels"]:
            print(
                f"| {name} | {r['concurrency']} | {r['requests']} | {r['tokens_per_s']:.1f} | "
                f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} | {r['itl_p50_ms']:.1f} / {r['itl_p99_ms']:.1f} | "
                f"{'yes' if res['greedy_outputs_consistent'] else 'NO'} |"
            )
    print(f"\nwrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    bad = [n for n, r in results.items() if not r["greedy_outputs_consistent"]]
    if "ferrite" in bad:
        sys.exit("bench-serve: Ferrite's greedy outputs differ between streams of the same prompt")


if __name__ == "__main__":
    main()
