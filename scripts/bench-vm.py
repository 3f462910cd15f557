#!/usr/bin/env python3
"""VM interpretation benchmark: Ferrite vs upstream IREE, one run, interleaved.

For each program in benches/vm/ (.vmasm assembled, .mlir compiled by the
pinned tools), both runtimes run the same .vmfb with a
small and a large iteration count; the difference cancels process start-up
and module loading, leaving the cost per loop iteration. Rounds alternate
Ferrite and upstream so machine noise hits both alike; the median of the
rounds is reported with the ratio Ferrite/upstream (lower is better).

Usage: scripts/bench-vm.py [--rounds N] [--iterations N]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv", "bin")
BUILD = os.path.join(ROOT, "build", "bench")
PROGRAMS = [("lcg", "lcg"), ("calls", "calls"), ("lcg_i64", "lcg"), ("float_loop", "float_loop")]


def run(cmd):
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"command failed: {' '.join(cmd)}\n{out.stdout}{out.stderr}")
    return dt, out.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=50_000_000)
    ap.add_argument("--ferrite", help="ferrite binary (default: build target/release/ferrite)")
    ap.add_argument("--upstream", default=os.path.join(VENV, "iree-run-module"),
                    help="upstream iree-run-module")
    ap.add_argument("--modules", help="directory of prebuilt <program>.vmfb (skips compiling)")
    ap.add_argument("--ferrite-flag", action="append", default=[],
                    help="extra flag for ferrite run-module, e.g. --vm_jit=false")
    args = ap.parse_args()
    os.makedirs(BUILD, exist_ok=True)
    ferrite = args.ferrite
    if ferrite is None:
        print("building ferrite (release)...", flush=True)
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "ferrite-cli"], cwd=ROOT, check=True)
        ferrite = os.path.join(ROOT, "target", "release", "ferrite")
    upstream = args.upstream
    small = max(1, args.iterations // 100)
    for name, fn in PROGRAMS:
        vmfb = os.path.join(args.modules or BUILD, name + ".vmfb")
        src = os.path.join(ROOT, "benches", "vm", name)
        if args.modules:
            pass
        elif os.path.exists(src + ".vmasm"):
            subprocess.run([os.path.join(VENV, "iree-as-module"), f"--output={vmfb}", src + ".vmasm"], check=True)
        else:
            subprocess.run([os.path.join(VENV, "iree-compile"), "--iree-hal-target-device=local",
                            "--iree-hal-local-target-device-backends=llvm-cpu",
                            "--iree-llvmcpu-target-cpu=generic", src + ".mlir", "-o", vmfb], check=True)
        per = {"ferrite": [], "upstream": []}
        outs = {}
        for r in range(args.rounds):
            for label, exe in (("ferrite", [ferrite, "run-module"] + args.ferrite_flag),
                               ("upstream", [upstream])):
                base = exe + [f"--module={vmfb}", f"--function={fn}"]
                t_small, _ = run(base + [f"--input={small}"])
                t_big, out = run(base + [f"--input={args.iterations}"])
                outs[label] = out
                per[label].append((t_big - t_small) / (args.iterations - small) * 1e9)
            print(f"  {name} round {r + 1}/{args.rounds}: ferrite {per['ferrite'][-1]:.2f} ns/iter, "
                  f"upstream {per['upstream'][-1]:.2f} ns/iter", flush=True)
        if outs["ferrite"] != outs["upstream"]:
            sys.exit(f"{name}: outputs differ:\nferrite:\n{outs['ferrite']}\nupstream:\n{outs['upstream']}")
        f, u = statistics.median(per["ferrite"]), statistics.median(per["upstream"])
        print(f"{name}: ferrite {f:.2f} ns/iter, upstream {u:.2f} ns/iter, ratio: {f / u:.2f}")
        tier = "interpreter" if "--vm_jit=false" in args.ferrite_flag else "compiling tier"
        bench_common.record("VM-bound loops (iree-run-module, calling thread)", f"{name} ({tier})", f, u,
                            "ns/iter", target=0.5 if tier == "compiling tier" else None,
                            note=f"median of {args.rounds} rounds of {args.iterations:g} iterations")
        # What the compiling tier did, and its load-time cost.
        tiers = subprocess.run([ferrite, "dump-module", "--output=jit", vmfb] + args.ferrite_flag,
                               capture_output=True, text=True).stdout.strip().splitlines()
        if tiers:
            print(f"  {name} {tiers[0]}; {tiers[-1]}", flush=True)


if __name__ == "__main__":
    main()
