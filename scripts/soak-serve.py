#!/usr/bin/env python3
"""Memory over many requests (issue 29: "memory stays flat over 10,000
requests"): starts `ferrite serve` on 127.0.0.1, sends N short requests
from C client threads (a mix of completions, streamed chat completions,
malformed bodies and streams the client drops after the first chunk), and
prints the server's resident memory (`ferrite_resident_memory_bytes` from
/metrics) and, where the server runs on glibc, its malloc heap in use
(`ferrite_heap_in_use_bytes`: a leak grows it, allocator fragmentation
grows only the resident memory) every `--every` requests.

    .venv/bin/python scripts/soak-serve.py [--requests 10000] [--concurrency 16]
        [--ferrite-bin target/release/ferrite] [--device local-task]
        [--kinds completion,chat-stream,malformed,dropped-stream]

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


def memory(url):
    """(resident bytes, heap bytes in use or None) from /metrics."""
    conn = connect(url)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    m = re.search(r"^ferrite_resident_memory_bytes (\d+)", text, re.M)
    h = re.search(r"^ferrite_heap_in_use_bytes (\d+)", text, re.M)
    return int(m.group(1)), int(h.group(1)) if h else None


KINDS = ["completion", "chat-stream", "malformed", "dropped-stream"]


def one(url, i, kinds):
    kind = KINDS.index(kinds[i % len(kinds)])
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


def in_use(pid, server_log):
    """glibc malloc's bytes in use (all arenas and mmapped chunks): gdb
    calls malloc_stats() in the server, which writes to its stderr."""
    subprocess.run(
        ["gdb", f"/proc/{pid}/exe", "-p", str(pid), "-batch", "-ex", "call (void)malloc_stats()"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    for _ in range(50):
        text = Path(server_log).read_text()
        tail = text.rsplit("Total (incl. mmap):", 1)
        if len(tail) == 2:
            m = re.search(r"in use bytes\s*=\s*(\d+)", tail[1])
            if m and "max mmap bytes" in tail[1]:
                return int(m.group(1))
        time.sleep(0.1)
    sys.exit("soak-serve: no malloc_stats() output in the server log")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--every", type=int, default=1000)
    ap.add_argument("--device", default="local-task")
    ap.add_argument("--ferrite-bin", default=str(ROOT / "target" / "release" / "ferrite"))
    ap.add_argument("--max-growth-mb", type=float, default=32)
    ap.add_argument("--server-log", help="append the server's stderr to this file (default: discarded)")
    ap.add_argument(
        "--heap",
        action="store_true",
        help="also print glibc malloc's in-use bytes at each sample (attaches gdb to call malloc_stats(); "
        "needs --server-log): a leak grows these, allocator fragmentation grows only RSS",
    )
    ap.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help="comma-separated request kinds cycled in this order (default: all four): " + ", ".join(KINDS),
    )
    args = ap.parse_args()
    if args.heap and not args.server_log:
        sys.exit("soak-serve: --heap needs --server-log")
    kinds = args.kinds.split(",")
    for k in kinds:
        if k not in KINDS:
            sys.exit(f"soak-serve: unknown kind '{k}' (known: {', '.join(KINDS)})")
    gguf = assets.ensure()
    cmd = [args.ferrite_bin, "serve", f"--gguf={gguf}", "--port=0", f"--device={args.device}", "--max_queue=4096"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    url = None
    for line in proc.stderr:
        m = re.search(r"listening on (http://[0-9.:]+)", line)
        if m:
            url = m.group(1)
            break
    log = open(args.server_log, "a") if args.server_log else None

    def drain():
        for line in proc.stderr:
            if log:
                log.write(line)
                log.flush()

    threading.Thread(target=drain, daemon=True).start()
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
                for s in pool.map(lambda i: one(url, i, kinds), range(done, done + n)):
                    statuses[s] = statuses.get(s, 0) + 1
                done += n
                resident, heap_now = memory(url)
                samples.append((done, resident, heap_now))
                heap = f"  heap {heap_now / 2**20:8.2f} MiB" if heap_now is not None else ""
                if args.heap:
                    heap += f"  heap in use (gdb) {in_use(proc.pid, args.server_log) / 2**20:8.2f} MiB"
                print(f"{done:6d} requests  {time.time() - start:7.1f} s  RSS {resident / 2**20:8.1f} MiB{heap}  statuses {statuses}", flush=True)
        growth = (samples[-1][1] - samples[0][1]) / 2**20
        print(f"RSS growth after the first {args.every} requests: {growth:+.1f} MiB")
        if len(samples) > 1:
            per = (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])
            print(f"slope after the first {args.every} requests: {per:+.0f} bytes per request ({args.kinds})")
            if samples[0][2] is not None and samples[-1][2] is not None:
                hper = (samples[-1][2] - samples[0][2]) / (samples[-1][0] - samples[0][0])
                print(f"heap slope after the first {args.every} requests: {hper:+.0f} bytes per request")
        if growth > args.max_growth_mb:
            sys.exit(f"soak-serve: resident memory grew {growth:.1f} MiB (> {args.max_growth_mb})")
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
