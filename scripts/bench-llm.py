#!/usr/bin/env python3
"""Issue 27's LLM bench: SmolLM2-135M (examples/llm/smollm2.vmfb over the
.gguf), Ferrite (`ferrite generate --benchmark`) against upstream
`iree.runtime` (examples/llm/upstream_loop.py) on the same vmfb, per device,
interleaved: time to first token for a 128-token prompt and decode tokens/s
over 128 greedy tokens, with each process's peak RSS. Writes JSON and a PNG.

    .venv/bin/python scripts/bench-llm.py [--devices local-sync,local-task]
        [--prompt_tokens 128] [--max_tokens 128] [--out build/bench-llm]
        [--ferrite target/release/ferrite]
"""

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "llm"))

import assets  # noqa: E402

UPSTREAM = r"""
import sys, time, resource, json
sys.path.insert(0, sys.argv[1])
import upstream_loop
m = upstream_loop.UpstreamModel(sys.argv[2], sys.argv[3])
ids = [int(s) for s in sys.argv[4].split(",")]
n = int(sys.argv[5])
out, _, ttft, dec = upstream_loop.UpstreamModel.greedy(m, ids, n)
print(json.dumps({"ids": out, "ttft_ms": ttft * 1e3, "decode_tok_s": (n - 1) / dec,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_ferrite(binary, gguf, device, ids, n):
    cmd = [str(binary), "generate", f"--gguf={gguf}", "--prompt_ids=" + ",".join(map(str, ids)),
           f"--max_tokens={n}", "--ignore_eos", "--output_ids", "--benchmark", f"--device={device}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    ttft = float(re.search(r"time to first token: ([\d.]+) ms", r.stderr).group(1))
    tok_s = float(re.search(r"decode: ([\d.]+) tokens/s", r.stderr).group(1))
    return {"ids": [int(s) for s in r.stdout.split()], "ttft_ms": ttft, "decode_tok_s": tok_s,
            # ru_maxrss of children is the largest child so far: exact for the
            # first run, an upper bound after.
            "peak_rss_mb": max(rss, before) / 1024}


def run_upstream(gguf, device, ids, n):
    r = subprocess.run([sys.executable, "-c", UPSTREAM, str(ROOT / "examples" / "llm"), str(gguf), device,
                        ",".join(map(str, ids)), str(n)], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", default="local-sync,local-task")
    ap.add_argument("--prompt_tokens", type=int, default=128)
    ap.add_argument("--max_tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "bench-llm")
    ap.add_argument("--ferrite", type=Path, default=ROOT / "target" / "release" / "ferrite")
    args = ap.parse_args()
    gguf = assets.ensure()
    # A fixed 128-token prompt: ordinary vocabulary ids cycled.
    base = [504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 8590, 314]
    ids = [base[i % len(base)] for i in range(args.prompt_tokens)]
    results = {"model": gguf.name, "gguf_mb": gguf.stat().st_size / 2**20, "prompt_tokens": args.prompt_tokens,
               "max_tokens": args.max_tokens, "ferrite_binary": str(args.ferrite), "cpus": os.cpu_count(),
               "kv_cache_mb": 30 * 2 * 2048 * 3 * 64 * 4 / 2**20, "runs": []}
    for device in args.devices.split(","):
        f = run_ferrite(args.ferrite, gguf, device, ids, args.max_tokens)
        u = run_upstream(gguf, device, ids, args.max_tokens)
        same = f["ids"] == u["ids"]
        for name, r in (("ferrite", f), ("upstream iree.runtime", u)):
            r = dict(r, runtime=name, device=device)
            r.pop("ids")
            results["runs"].append(r)
            print(f"{device:11s} {name:22s} ttft {r['ttft_ms']:9.1f} ms  decode {r['decode_tok_s']:6.2f} tok/s"
                  f"  peak RSS {r['peak_rss_mb']:7.1f} MB", flush=True)
        print(f"{device:11s} identical ids: {same}", flush=True)
        results.setdefault("identical_ids", {})[device] = same
    results["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench-llm.json").write_text(json.dumps(results, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        labels = [f"{r['runtime']}\n{r['device']}" for r in results["runs"]]
        axes[0].bar(labels, [r["ttft_ms"] for r in results["runs"]])
        axes[0].set_title(f"time to first token ({args.prompt_tokens}-token prompt), ms")
        axes[1].bar(labels, [r["decode_tok_s"] for r in results["runs"]])
        axes[1].set_title("decode tokens/s (greedy)")
        for a in axes:
            a.tick_params(axis="x", labelsize=7)
        fig.tight_layout()
        fig.savefig(args.out / "bench-llm.png", dpi=100)
    except ImportError:
        print("bench-llm: matplotlib missing, no PNG", file=sys.stderr)
    print(f"bench-llm: wrote {args.out}/bench-llm.json", file=sys.stderr)


if __name__ == "__main__":
    main()
