#!/usr/bin/env python3
"""Per-call CPU time of a tiny invocation, Ferrite against upstream (issue 26, Cost).

Alternates rounds of upstream's `iree-benchmark-module` and one or more
`ferrite benchmark-module` binaries on the same module, function, inputs and
device, each round one timing of --min-time seconds, and reads each timing's
`cpu_time` from `--benchmark_format=json` (process CPU time per call: unlike
wall time it hardly moves with other processes on the machine). Prints every
round, then per binary the median CPU time, the ratio of medians to
upstream's and the range of per-round ratios (lower is better).

Usage: scripts/bench-call-cpu.py [--rounds N] [--min-time S] [--module M.vmfb]
           [--device local-sync] [FERRITE_BINARY ...]
Default module: benches/hal/add.mlir compiled here (--cpu, default
x86-64-v3) into build/bench-call-cpu/add.vmfb, called as `add` with
4xf32=1,2,3,4 and 4xf32=10; default binary target/release/ferrite.
Environment: UPSTREAM_BIN (folder with iree-benchmark-module and
iree-compile; default .venv/bin).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_us(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    bench = json.loads(out[out.index("{"):])["benchmarks"][0]
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[bench["time_unit"]]
    return bench["cpu_time"] * scale


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--min-time", default="0.3")
    p.add_argument("--module")
    p.add_argument("--function", default="add")
    p.add_argument("--input", action="append")
    p.add_argument("--device", default="local-sync")
    p.add_argument("--cpu", default="x86-64-v3")
    p.add_argument("binaries", nargs="*")
    a = p.parse_args()
    up_bin = os.environ.get("UPSTREAM_BIN", os.path.join(ROOT, ".venv", "bin"))
    module = a.module
    if module is None:
        out_dir = os.path.join(ROOT, "build", "bench-call-cpu")
        os.makedirs(out_dir, exist_ok=True)
        module = os.path.join(out_dir, "add.vmfb")
        subprocess.run(
            [
                os.path.join(up_bin, "iree-compile"),
                os.path.join(ROOT, "benches", "hal", "add.mlir"),
                "--iree-hal-target-device=local",
                "--iree-hal-local-target-device-backends=llvm-cpu",
                f"--iree-llvmcpu-target-cpu={a.cpu}",
                "-o",
                module,
            ],
            check=True,
        )
    inputs = a.input or ["4xf32=1,2,3,4", "4xf32=10"]
    args = [f"--module={module}", f"--function={a.function}", f"--device={a.device}"]
    args += [f"--input={i}" for i in inputs]
    args += [f"--benchmark_min_time={a.min_time}s", "--benchmark_format=json"]
    binaries = a.binaries or [os.path.join(ROOT, "target", "release", "ferrite")]
    runs = {"upstream": [os.path.join(up_bin, "iree-benchmark-module")] + args}
    for b in binaries:
        runs[b] = [b, "benchmark-module"] + args
    times = {name: [] for name in runs}
    for r in range(a.rounds):
        for name, cmd in runs.items():
            times[name].append(cpu_us(cmd))
        print(f"round {r + 1}: " + "  ".join(f"{n} {t[-1]:.3f} us" for n, t in times.items()))
    up = times["upstream"]
    print(f"upstream: CPU {statistics.median(up):.3f} us/call (median of {a.rounds})")
    for b in binaries:
        t = times[b]
        ratios = [x / u for x, u in zip(t, up)]
        print(
            f"{b}: CPU {statistics.median(t):.3f} us/call (range {min(t):.3f}-{max(t):.3f}), "
            f"ratio of medians {statistics.median(t) / statistics.median(up):.3f}, "
            f"per-round ratios {min(ratios):.3f}-{max(ratios):.3f}"
        )


if __name__ == "__main__":
    sys.exit(main())
