#!/usr/bin/env python3
"""Large numpy inputs: call time and peak RSS, ferrite.runtime vs iree.runtime.

Sums a 64M-element float32 array (256 MB) through the system API on
local-sync. Each runtime runs in its own child process (so peak RSS is its
own), alternating for several rounds; the child allocates the input 64-byte
aligned (what ferrite needs to use the array's memory in place; upstream
copies every input), calls once to warm up, then times `--calls` calls.
Reports the median call time, the child's peak RSS (`ru_maxrss`) and the
RSS it added over the input array alone, with ratios ferrite / upstream.

Usage: .venv/bin/python scripts/bench-zero-copy.py [--rounds N] [--calls N] [--mib N]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from bench_common import compile_for_host, record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = """func.func @sum(%a: tensor<?xf32>) -> tensor<f32> {
  %init = arith.constant dense<0.0> : tensor<f32>
  %0 = linalg.reduce ins(%a : tensor<?xf32>) outs(%init : tensor<f32>) dimensions = [0]
    (%x: f32, %acc: f32) {
      %s = arith.addf %x, %acc : f32
      linalg.yield %s : f32
    }
  return %0 : tensor<f32>
}
"""


def compile_sum():
    return compile_for_host(SRC, "py_sum")


def child(runtime, vmfb, mib, calls):
    """Runs in the child: prints one JSON line of measurements."""
    import numpy as np
    rt = __import__(runtime, fromlist=["load_vm_flatbuffer_file"])
    n = mib * (1 << 20) // 4
    raw = np.empty(n * 4 + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    x = raw[start:start + n * 4].view(np.float32)
    x[:] = 0.0  # touches every page, so the input is all in the baseline RSS
    x[::1 << 16] = 1.0  # a sum that f32 accumulation gets exactly
    base_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    m = rt.load_vm_flatbuffer_file(vmfb, driver="local-sync")
    got = float(m.sum(x).to_host())
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        r = m.sum(x)
        times.append(time.perf_counter() - t0)
        del r
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"sum": got, "expected": float(len(x[::1 << 16])), "ms": statistics.median(times) * 1e3,
                      "peak_mib": peak_kib / 1024, "added_mib": (peak_kib - base_kib) / 1024}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--mib", type=int, default=256, help="input size in MiB")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--vmfb", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.vmfb, args.mib, args.calls)
        return
    vmfb = compile_sum()
    results = {"ferrite": [], "upstream": []}
    modules = {"ferrite": "ferrite.runtime", "upstream": "iree.runtime"}
    for r in range(args.rounds):
        for name, module in modules.items():
            out = subprocess.run([sys.executable, __file__, "--child", module, "--vmfb", vmfb,
                                  "--mib", str(args.mib), "--calls", str(args.calls)],
                                 check=True, capture_output=True, text=True).stdout
            m = json.loads(out.strip().splitlines()[-1])
            if m["sum"] != m["expected"]:
                sys.exit(f"{name} summed {m['sum']}, expected {m['expected']}")
            results[name].append(m)
            print(f"  round {r + 1}/{args.rounds} {name}: {m['ms']:.2f} ms/call, peak RSS "
                  f"{m['peak_mib']:.0f} MiB (+{m['added_mib']:.0f} MiB over the input)", flush=True)
    med = {n: {k: statistics.median(x[k] for x in v) for k in ("ms", "peak_mib", "added_mib")}
           for n, v in results.items()}
    f, u = med["ferrite"], med["upstream"]
    print(f"local-sync sum of {args.mib} MiB f32: ferrite {f['ms']:.2f} ms/call, upstream {u['ms']:.2f} ms/call, "
          f"ratio: {f['ms'] / u['ms']:.2f}")
    print(f"peak RSS: ferrite {f['peak_mib']:.0f} MiB, upstream {u['peak_mib']:.0f} MiB, "
          f"ratio: {f['peak_mib'] / u['peak_mib']:.2f}; added over the input: ferrite "
          f"{f['added_mib']:.0f} MiB, upstream {u['added_mib']:.0f} MiB")
    record("Zero-copy input (vs iree.runtime)", f"sum of a {args.mib} MiB f32 numpy array, local-sync",
           f["ms"], u["ms"], "ms/call", None,
           f"peak RSS {f['peak_mib']:.0f} / {u['peak_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
