#!/usr/bin/env python3
"""Alternated A/B timings of local-task policies, idle and under one CPU load.

Where `scripts/bench-load.py` gives the README's idle/loaded ratios (each
timing with a fresh load), this script compares settings of one binary
against each other and against upstream under the *same* load: it starts
one busy process per CPU (each in a session of its own, bounded by
`timeout`, killed on exit), lets it settle, and then times every
configuration once per round, round after round, so slow and fast phases
of the load fall on all of them alike. Medians and ratios to upstream's
local-task come at the end of each case; `--json` keeps every timing.

Configurations: upstream `iree-benchmark-module` on local-task and
local-sync, Ferrite's `benchmark-module` on local-task as built, each
`--variant NAME:VAR=VALUE[,VAR=VALUE]` (Ferrite on local-task with those
environment variables), and Ferrite on local-sync.

    scripts/bench-load-ab.py --modules DIR [--cases mlp minilm add chain100]
        [--variant off:FERRITE_LOCAL_TASK_SOLO=0] [--rounds 8] [--idle-rounds 2]
        [--alternate] [--ferrite PATH] [--upstream-bin DIR] [--json OUT]

DIR holds add.vmfb, chain100.vmfb and mlp.vmfb (benches/hal/*.mlir compiled
for the machine, as `scripts/bench-load.py --modules` takes them); MiniLM is
the committed examples/minilm/minilm.vmfb with MiniLM-shaped random weights
written once (numpy). `--alternate` reverses the order of the
configurations every other round.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_common  # noqa: E402
T = r"([0-9.]+)\s*(ns|us|ms|s)\b"
US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
CASES = {
    "mlp": ("mlp", "mlp", ["8x128xf32=0.5"]),
    "add": ("add", "add", ["4xf32=1", "4xf32=2"]),
    "chain100": ("chain100", "chain", ["16xf32=1"]),
    "minilm": (None, "embed", ["1x128xi64=1", "1x128xi64=1"]),
}


def log(msg):
    print(msg, flush=True)


def time_one(cmd, env_extra):
    """One benchmark-module timing: microseconds per call, or None."""
    env = dict(os.environ, **env_extra)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    out = p.stdout + p.stderr
    m = re.search(rf"real_time\s+{T}", out)
    if p.returncode != 0 or not m:
        log(f"FAILED ({p.returncode}): {' '.join(cmd)}\n{out[-2000:]}")
        return None
    return float(m.group(1)) * US[m.group(2)]


def configs(args, case):
    src, fn, inputs = CASES[case]
    if src is None:
        module = os.path.join(ROOT, "examples", "minilm", "minilm.vmfb")
        mod = [f"--module={module}", f"--parameters=model={minilm_weights(args)}"]
    else:
        mod = [f"--module={os.path.join(args.modules, src + '.vmfb')}"]
    base = [*mod, f"--function={fn}", *[f"--input={i}" for i in inputs],
            f"--benchmark_min_time={args.min_time}s"]
    up = os.path.join(args.upstream_bin, "iree-benchmark-module")
    fe = [args.ferrite, "benchmark-module"]
    c = {"upstream": ([up, "--device=local-task", *base], {}),
         "ferrite": ([*fe, "--device=local-task", *base], {})}
    for v in args.variant:
        name, _, assigns = v.partition(":")
        env = dict(a.split("=", 1) for a in assigns.split(",") if a)
        c[f"ferrite-{name}"] = ([*fe, "--device=local-task", *base], env)
    if case != "minilm" or args.minilm_sync:
        c["ferrite-sync"] = ([*fe, "--device=local-sync", *base], {})
        c["upstream-sync"] = ([up, "--device=local-sync", *base], {})
    return c


def minilm_weights(args):
    path = args.minilm_weights or os.path.join(ROOT, "build", "minilm_random.safetensors")
    if not os.path.exists(path):
        sys.path.insert(0, os.path.join(ROOT, "examples", "minilm"))
        import model  # noqa: E402 (numpy only)

        os.makedirs(os.path.dirname(path), exist_ok=True)
        log("writing MiniLM-shaped random weights...")
        model.write_random_safetensors(path)
    return path


def rounds(label, cfgs, n, alternate):
    got = {k: [] for k in cfgs}
    for r in range(n):
        items = list(cfgs.items())
        if alternate and r % 2:
            items.reverse()
        for k, (cmd, env) in items:
            v = time_one(cmd, env)
            if v is not None:
                got[k].append(v)
        log(f"  {label} round {r + 1}/{n}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in got.items() if v))
    med = {k: statistics.median(v) for k, v in got.items() if v}
    ref = med.get("upstream")
    log(f"{label} medians (us): " + ", ".join(
        f"{k} {v:.1f}" + (f" ({v / ref:.2f}x)" if ref else "") for k, v in med.items()))
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", required=True, help="folder of add/chain100/mlp .vmfb files")
    ap.add_argument("--cases", nargs="*", default=["mlp", "minilm"], choices=list(CASES))
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:VAR=VALUE[,VAR=VALUE]: Ferrite on local-task with these variables")
    ap.add_argument("--rounds", type=int, default=8, help="loaded rounds")
    ap.add_argument("--idle-rounds", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds per timing")
    ap.add_argument("--alternate", action="store_true", help="reverse the order every other round")
    ap.add_argument("--minilm-sync", action="store_true", help="also time MiniLM on local-sync (slow)")
    ap.add_argument("--minilm-weights", help="MiniLM .safetensors (scope `model`)")
    ap.add_argument("--load-seconds", type=int, default=600, help="longest life of each busy process")
    ap.add_argument("--ferrite", default=os.environ.get("FERRITE", os.path.join(ROOT, "target", "release", "ferrite")))
    ap.add_argument("--upstream-bin", default=os.environ.get("UPSTREAM_BIN", os.path.join(ROOT, ".venv", "bin")))
    ap.add_argument("--json", help="write every timing here")
    args = ap.parse_args()
    for tool in (args.ferrite, os.path.join(args.upstream_bin, "iree-benchmark-module")):
        if not os.path.exists(tool):
            sys.exit(f"{tool} not found (--ferrite / FERRITE, --upstream-bin / UPSTREAM_BIN)")
    log(f"ferrite: {args.ferrite}; upstream: {args.upstream_bin}; {os.cpu_count()} CPUs; "
        f"load: {os.cpu_count()} busy processes")
    out = {}
    for case in args.cases:
        cfgs = configs(args, case)
        out[f"{case}-idle"] = rounds(f"{case} idle", cfgs, args.idle_rounds, args.alternate)
        with bench_common.CpuLoad(args.load_seconds):
            out[f"{case}-loaded"] = rounds(f"{case} loaded", cfgs, args.rounds, args.alternate)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
