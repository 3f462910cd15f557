#!/usr/bin/env python3
"""What tracing costs (issue 28), on the dispatch-chain bench (benches/hal/chain100.mlir:
100 small dependent dispatches per call).

1. Off: two `ferrite` executables, BEFORE (without the recorder) and AFTER (with it,
   not recording), alternated round by round so machine noise hits both alike;
   the median per-call time of each and AFTER/BEFORE.
2. On: AFTER with and without `--trace` (and with `--device_profiling_mode`), alternated;
   (traced - untraced) / dispatches per call = the cost per dispatch.

Before timing, both executables' results are checked equal to upstream's
`iree-run-module` on the same module and input.

3. --instructions: instructions per call on local-sync counted by valgrind
   (cachegrind): (count at --repeat=51 - count at --repeat=1) / 50, for BEFORE,
   AFTER and AFTER with --trace. Unlike wall time this does not move with the
   machine's load, so it resolves a 1% change on a busy 2-core machine. The
   module is compiled for x86-64-v3 there (valgrind decodes no AVX-512).

Usage: scripts/bench-trace-cost.py --before=BIN --after=BIN [--rounds=N]
       [--min-time=SECONDS] [--devices=local-sync,local-task] [--instructions]
The module is compiled for the host CPU into build/bench/chain100.vmfb.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.environ.get("VENV", os.path.join(ROOT, ".venv"))
BUILD = os.path.join(ROOT, "build", "bench")
DISPATCHES = 100
INPUT = "16xf32=1"
UNITS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def compile_chain(cpu="host"):
    os.makedirs(BUILD, exist_ok=True)
    out = os.path.join(BUILD, f"chain100-{cpu}.vmfb")
    subprocess.run(
        [os.path.join(VENV, "bin", "iree-compile"), "--iree-hal-target-device=local",
         "--iree-hal-local-target-device-backends=llvm-cpu", f"--iree-llvmcpu-target-cpu={cpu}",
         os.path.join(ROOT, "benches", "hal", "chain100.mlir"), "-o", out],
        check=True)
    return out


def result(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout}{p.stderr}")
    return p.stdout.strip().splitlines()[-1]


def per_call_ns(cmd):
    """Mean time per call (ns) of benchmark-module's console report."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout}{p.stderr}")
    for line in p.stdout.splitlines():
        m = re.match(r"\s*BM_\S+\s+([\d.]+)\s*(ns|us|ms|s)\s+", line)
        if m:
            return float(m.group(1)) * UNITS[m.group(2)]
    sys.exit(f"no timing row in:\n{p.stdout}")


def bench(binary, module, device, min_time, extra=()):
    return per_call_ns([binary, "benchmark-module", f"--module={module}", "--function=chain",
                        f"--input={INPUT}", f"--device={device}", "--task_topology_group_count=2",
                        f"--benchmark_min_time={min_time}s", *extra])


def instructions(binary, module, extra=()):
    """Instructions per call on local-sync (see the module docs, 3.)."""
    counts = []
    for repeat in (1, 51):
        p = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no",
                            "--cachegrind-out-file=/dev/null", binary, "run-module",
                            f"--module={module}", "--function=chain", f"--input={INPUT}",
                            "--device=local-sync", f"--repeat={repeat}", "--output=", *extra],
                           capture_output=True, text=True)
        m = re.search(r"I\s+refs:\s+([\d,]+)", p.stderr)
        if p.returncode != 0 or not m:
            sys.exit(f"valgrind failed on {binary}:\n{p.stderr[-2000:]}")
        counts.append(int(m.group(1).replace(",", "")))
    return (counts[1] - counts[0]) / 50


def alternate(label_a, run_a, label_b, run_b, rounds):
    a, b = [], []
    for r in range(rounds):
        # Alternate which goes first, so a trend over the run hits both alike.
        first, second = ((run_a, a), (run_b, b)) if r % 2 == 0 else ((run_b, b), (run_a, a))
        first[1].append(first[0]())
        second[1].append(second[0]())
    # On a loaded machine noise only adds time: the fastest round is the
    # steadier estimate; the median is printed too.
    ma, mb = min(a), min(b)
    for label, xs in ((label_a, a), (label_b, b)):
        print(f"    {label}: min {min(xs) / 1e3:.2f} us/call, median {statistics.median(xs) / 1e3:.2f}"
              f"  (rounds: {', '.join(f'{x / 1e3:.1f}' for x in xs)})")
    return ma, mb


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="ferrite without the recorder")
    ap.add_argument("--after", required=True, help="ferrite with the recorder")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--devices", default="local-sync,local-task")
    ap.add_argument("--instructions", action="store_true")
    args = ap.parse_args()
    if args.instructions:
        module = compile_chain("x86-64-v3")
        before = instructions(args.before, module)
        after = instructions(args.after, module)
        want = result([os.path.join(VENV, "bin", "iree-run-module"), f"--module={module}",
                       "--function=chain", f"--input={INPUT}"])
        for binary in (args.before, args.after):
            got = result([binary, "run-module", f"--module={module}", "--function=chain",
                          f"--input={INPUT}"])
            if got != want:
                sys.exit(f"{binary}: result {got!r} differs from upstream's {want!r}")
        before = instructions(args.before, module)
        after = instructions(args.after, module)
        # Recording on, output cheap: --print_device_statistics records the
        # same events as --trace and only sums them at exit (--trace also
        # formats every event as JSON at exit, which the second line counts).
        recorded = instructions(args.after, module, ["--print_device_statistics"])
        traced = instructions(args.after, module, [f"--trace={os.path.join(BUILD, 'vg.trace.json')}"])
        print(f"local-sync instructions per call: before {before:,.0f}, after {after:,.0f} "
              f"(after/before = {after / before:.4f}, {(after / before - 1) * 100:+.2f}%)")
        print(f"  recording on (--print_device_statistics): {recorded:,.0f} per call, "
              f"{(recorded - after) / DISPATCHES:,.0f} more per dispatch")
        print(f"  with --trace: {traced:,.0f} per call, {(traced - after) / DISPATCHES:,.0f} more per dispatch "
              f"(with writing the JSON at exit, proportional to the calls)")
        return
    module = compile_chain()
    want = result([os.path.join(VENV, "bin", "iree-run-module"), f"--module={module}",
                   "--function=chain", f"--input={INPUT}"])
    for binary in (args.before, args.after):
        got = result([binary, "run-module", f"--module={module}", "--function=chain", f"--input={INPUT}"])
        if got != want:
            sys.exit(f"{binary}: result {got!r} differs from upstream's {want!r}")
    print(f"results equal upstream's: {want[:60]}...")
    trace = os.path.join(BUILD, "chain100.trace.json")
    bundle = os.path.join(BUILD, "chain100.ireeprof")
    for device in args.devices.split(","):
        print(f"{device}:")
        print("  tracing off, before vs after:")
        b, a = alternate("before", lambda: bench(args.before, module, device, args.min_time),
                         "after ", lambda: bench(args.after, module, device, args.min_time),
                         args.rounds)
        print(f"  after/before (min) = {a / b:.4f}  ({(a / b - 1) * 100:+.2f}%)")
        print("  tracing on (--trace), after:")
        off, on = alternate("off     ", lambda: bench(args.after, module, device, args.min_time),
                            "--trace ", lambda: bench(args.after, module, device, args.min_time,
                                                      [f"--trace={trace}"]),
                            args.rounds)
        print(f"  cost per dispatch with --trace: {(on - off) / DISPATCHES:.0f} ns")
        _, prof = alternate("off     ", lambda: bench(args.after, module, device, args.min_time),
                            "profile ", lambda: bench(args.after, module, device, args.min_time,
                                                      ["--device_profiling_mode=queue-events,dispatch-events",
                                                       f"--device_profiling_output={bundle}"]),
                            args.rounds)
        print(f"  cost per dispatch with queue+dispatch events: {(prof - off) / DISPATCHES:.0f} ns")


if __name__ == "__main__":
    main()
