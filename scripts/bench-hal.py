#!/usr/bin/env python3
"""HAL benchmark: Ferrite vs upstream IREE on compiled tensor programs, one run, interleaved.

Each case runs the same .vmfb, function, inputs and device through
`ferrite benchmark-module` and upstream's pinned `iree-benchmark-module`
(same flags), alternating the two in rounds so machine noise hits both
alike. Reported per case: the median over rounds of the per-call wall time,
the ratio Ferrite/upstream (lower is better) and each process's peak RSS
(`/usr/bin/time -f %M`, the largest over the rounds).

Cases (sources in benches/hal/, compiled here for the host CPU into build/bench/):
  add      4xf32 add: invocation overhead, on local-sync and local-task
  chain100 100 small dependent dispatches (util.optimization_barrier keeps
           them unfused; the script checks the module records >= 100)
  matmul   1024x1024x1024 f32 matmul on local-task with 2 workers
           (--task_topology_group_count=2 for both runtimes)

Before timing, each case's results are checked equal (run-module output).

Usage: scripts/bench-hal.py [--rounds N] [--min-time SECONDS] [--only NAME...]
"""
import argparse
import bench_common
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.environ.get("VENV", os.path.join(ROOT, ".venv"))
BIN = os.path.join(VENV, "bin")
BUILD = os.path.join(ROOT, "build", "bench")
FERRITE = os.path.join(ROOT, "target", "release", "ferrite")
TIME = "/usr/bin/time"
COMPILE_FLAGS = [
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
]

# name, source, function, inputs, device flags, min_time (None: --min-time)
CASES = [
    ("add/local-sync", "add", "add", ["4xf32=1,2,3,4", "4xf32=10"], ["--device=local-sync"], None),
    ("add/local-task", "add", "add", ["4xf32=1,2,3,4", "4xf32=10"],
     ["--device=local-task", "--task_topology_group_count=2"], None),
    ("chain100/local-sync", "chain100", "chain", ["16xf32=1"], ["--device=local-sync"], None),
    ("chain100/local-task", "chain100", "chain", ["16xf32=1"],
     ["--device=local-task", "--task_topology_group_count=2"], None),
    ("matmul/local-task-2", "matmul", "matmul", ["1024x1024xf32=0.5", "1024x1024xf32=2"],
     ["--device=local-task", "--task_topology_group_count=2"], "10x"),
]

# The ratio each case aims for (issue targets).
TARGETS = {"add/local-sync": 0.5, "add/local-task": 0.5, "chain100/local-sync": 0.7,
           "chain100/local-task": 0.7, "matmul/local-task-2": 1.02}

UNITS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def log(msg):
    print(msg, flush=True)


def run_rss(cmd):
    """Runs cmd; returns (stdout, peak RSS in KiB of cmd's own process).

    Uses `/usr/bin/time -f %M` (its child is forked from a small process,
    so the figure is the tool's own peak). Without it, falls back to
    os.wait4 on a child forked from Python, whose peak then includes the
    Python image copied at fork (~10 MiB) and is only an upper bound.
    """
    if os.path.exists(TIME):
        rss_file = os.path.join(BUILD, ".rss")
        p = subprocess.run([TIME, "-f", "%M", "-o", rss_file, *cmd], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}{p.stderr}")
        with open(rss_file) as f:
            return p.stdout, int(f.read().split()[-1])
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{out}")
    return out, usage.ru_maxrss


def parse_ferrite(out):
    # With repetitions the table ends in `_mean`; a single repetition
    # prints only its `BM_...` row (google benchmark's console format).
    m = re.search(r"_mean\s+([0-9.]+) (ns|us|ms|s)\b", out) or re.search(
        r"^BM_\S+\s+([0-9.]+) (ns|us|ms|s)\b", out, re.M)
    if not m:
        sys.exit(f"cannot parse ferrite benchmark output:\n{out}")
    return float(m.group(1)) * UNITS[m.group(2)]


def parse_upstream(out):
    times = []
    for obj in out.split("{")[1:]:
        if '"run_type": "iteration"' not in obj:
            continue
        t = re.search(r'"real_time":\s*([0-9.eE+-]+)', obj)
        u = re.search(r'"time_unit":\s*"(\w+)"', obj)
        if t and u:
            times.append(float(t.group(1)) * UNITS[u.group(1)])
    if not times:
        sys.exit(f"cannot parse iree-benchmark-module output:\n{out}")
    return statistics.mean(times)


def fmt(ns):
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} us"
    return f"{ns:.0f} ns"


def compile_sources(names):
    os.makedirs(BUILD, exist_ok=True)
    for name in names:
        src = os.path.join(ROOT, "benches", "hal", name + ".mlir")
        vmfb = os.path.join(BUILD, name + ".vmfb")
        if os.path.exists(vmfb) and os.path.getmtime(vmfb) > os.path.getmtime(src):
            continue
        log(f"compiling {name}.mlir (host CPU)...")
        subprocess.run([os.path.join(BIN, "iree-compile"), *COMPILE_FLAGS, src, "-o", vmfb], check=True)
    chain = os.path.join(BUILD, "chain100.vmfb")
    if "chain100" in names:
        dis = subprocess.run([os.path.join(BIN, "iree-dump-module"), "--output=disassembly", chain],
                             capture_output=True, text=True, check=True).stdout
        n = len(re.findall(r"call(?:\.variadic)? @hal\.command_buffer\.dispatch\b", dis))
        log(f"chain100.vmfb records {n} dispatches")
        if n < 100:
            sys.exit("chain100 was fused: fewer than 100 dispatches")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds per timed process")
    ap.add_argument("--only", nargs="*", help="case name prefixes to run")
    args = ap.parse_args()
    cases = [c for c in CASES if not args.only or any(c[0].startswith(o) for o in args.only)]
    log("building ferrite (release)...")
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "ferrite-cli"], cwd=ROOT, check=True)
    compile_sources(sorted({c[1] for c in cases}))
    summary = []
    for name, src, fn, inputs, dev, min_time in cases:
        vmfb = os.path.join(BUILD, src + ".vmfb")
        common = [f"--module={vmfb}", f"--function={fn}", *[f"--input={i}" for i in inputs], *dev]
        # Same results first.
        f_out = subprocess.run([FERRITE, "run-module", *common], capture_output=True, text=True)
        u_out = subprocess.run([os.path.join(BIN, "iree-run-module"), *common], capture_output=True, text=True)
        if (f_out.returncode, f_out.stdout) != (u_out.returncode, u_out.stdout):
            sys.exit(f"{name}: results differ\nferrite:\n{f_out.stdout}{f_out.stderr}\nupstream:\n{u_out.stdout}{u_out.stderr}")
        mt = min_time or f"{args.min_time}s"
        bench = [*common, f"--benchmark_min_time={mt}"]
        per = {"ferrite": [], "upstream": []}
        rss = {"ferrite": 0, "upstream": 0}
        for r in range(args.rounds):
            for label in ("ferrite", "upstream") if r % 2 == 0 else ("upstream", "ferrite"):
                if label == "ferrite":
                    out, kb = run_rss([FERRITE, "benchmark-module", *bench])
                    per[label].append(parse_ferrite(out))
                else:
                    out, kb = run_rss([os.path.join(BIN, "iree-benchmark-module"), *bench,
                                       "--benchmark_format=json"])
                    per[label].append(parse_upstream(out))
                rss[label] = max(rss[label], kb)
            log(f"  {name} round {r + 1}/{args.rounds}: ferrite {fmt(per['ferrite'][-1])}, "
                f"upstream {fmt(per['upstream'][-1])}")
        f, u = statistics.median(per["ferrite"]), statistics.median(per["upstream"])
        line = (f"{name}: ferrite {fmt(f)}/call, upstream {fmt(u)}/call, ratio: {f / u:.2f}; "
                f"peak RSS ferrite {rss['ferrite'] / 1024:.1f} MiB, upstream {rss['upstream'] / 1024:.1f} MiB")
        log(line)
        summary.append(line)
        bench_common.record("HAL and CPU devices (vs iree-benchmark-module)", name, f / 1e3, u / 1e3, "us/call",
                            TARGETS.get(name),
                            f"peak RSS {rss['ferrite'] / 1024:.1f} / {rss['upstream'] / 1024:.1f} MiB")
    log("\nsummary (ratio = ferrite / upstream, lower is better):")
    for s in summary:
        log("  " + s)


if __name__ == "__main__":
    main()
