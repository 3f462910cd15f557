#!/usr/bin/env python3
"""Memory over many requests (issue 29: "memory stays flat over 10,000
requests"): starts `ferrite serve` on 127.0.0.1, sends N short requests
from C client threads (a mix of completions, streamed chat completions,
malformed bodies and streams the client drops after the first chunk), and
prints the server's resident memory (`ferrite_resident_memory_bytes` from
/metrics) every `--every` requests.

    .venv/bin/python scripts/soak-serve.py [--requests 10000] [--concurrency 16]
        [--ferrite-bin target/release/ferrite] [--device local-task]

Exits non-zero when the resident memory at the end exceeds the one after
the first `--every` requests by more than `--max-growth-mb` (default 32).
"""

import argparse
import http.client
import json
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "llm"))
import assets  # noqa: E402


def connect(url):
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=120)


def post(url, path, body, read_all=True):
    conn = connect(url)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"content-type": "application/json"})
        r = conn.getresponse()
        if read_all:
            r.read()
        else:
            r.readline()  # the first line of the stream, then hang up
        return r.status
    finally:
        conn.close()


def rss(url):
    conn = connect(url)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    m = re.search(r"^ferrite_resident_memory_bytes (\d+)", text, re.M)
    return int(m.group(1))


def one(url, i):
    kind = i % 4
    if kind == 0:
        return post(url, "/v1/completions", {"model": "default", "prompt": f"Number {i} is", "max_tokens": 2, "temperature": 0})
    if kind == 1:
        msgs = [{"role": "user", "content": f"Say {i}"}]
        return post(url, "/v1/chat/completions", {"model": "default", "messages": msgs, "max_tokens": 2, "stream": True})
    if kind == 2:
        return post(url, "/v1/completions", b'{"model": "default", "prompt": ')
    return post(
        url,
        "/v1/completions",
        {"model": "default", "prompt": "Tell a story", "max_tokens": 64, "ignore_eos": True, "stream": True},
        read_all=False,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--every", type=int, default=1000)
    ap.add_argument("--device", default="local-task")
    ap.add_argument("--ferrite-bin", default=str(ROOT / "target" / "release" / "ferrite"))
    ap.add_argument("--max-growth-mb", type=float, default=32)
    args = ap.parse_args()
    gguf = assets.ensure()
    cmd = [args.ferrite_bin, "serve", f"--gguf={gguf}", "--port=0", f"--device={args.device}", "--max_queue=4096"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    url = None
    for line in proc.stderr:
        m = re.search(r"listening on (http://[0-9.:]+)", line)
        if m:
            url = m.group(1)
            break
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    if url is None:
        sys.exit("soak-serve: the server did not start")
    try:
        while True:
            try:
                c = connect(url)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.3)
        statuses = {}
        samples = []
        start = time.time()
        done = 0
        with ThreadPoolExecutor(args.concurrency) as pool:
            while done < args.requests:
                n = min(args.every, args.requests - done)
                for s in pool.map(lambda i: one(url, i), range(done, done + n)):
                    statuses[s] = statuses.get(s, 0) + 1
                done += n
                samples.append((done, rss(url)))
                print(f"{done:6d} requests  {time.time() - start:7.1f} s  RSS {samples[-1][1] / 2**20:8.1f} MiB  statuses {statuses}", flush=True)
        growth = (samples[-1][1] - samples[0][1]) / 2**20
        print(f"RSS growth after the first {args.every} requests: {growth:+.1f} MiB")
        if growth > args.max_growth_mb:
            sys.exit(f"soak-serve: resident memory grew {growth:.1f} MiB (> {args.max_growth_mb})")
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
