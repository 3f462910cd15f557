#!/usr/bin/env python3
"""Busy-machine benchmark (issue 25): Ferrite vs the pinned upstream runtime,
idle and with every CPU kept busy, side by side.

Each case runs `ferrite benchmark-module --compare-upstream --under-load`
(the CLI mode this script drives): the same module, function, inputs and
device are timed by Ferrite and by upstream's `iree-benchmark-module` on the
idle machine, then again while one busy process per CPU runs; the command
starts that load itself (each process limited to --load-seconds by
timeout(1)) and kills it as soon as the loaded timing ends. Rounds repeat
that; the table shows the median of rounds, idle and loaded ratios
(Ferrite / upstream, lower is better) side by side.

Cases (on local-sync and local-task with default settings, i.e. one worker
per CPU for both runtimes):
  add       4xf32 add (benches/hal/add.mlir): invocation overhead
  chain100  100 small dependent dispatches (benches/hal/chain100.mlir)
  mlp       a small MLP, batch 8, 128-256-256-10 (benches/hal/mlp.mlir)
  minilm    all-MiniLM-L6-v2, batch 1, seq 128: the committed parameterized
            examples/minilm/minilm.vmfb with --minilm-weights (default:
            MiniLM-shaped random weights written to build/bench-load/)

Usage: scripts/bench-load.py [--rounds N] [--min-time S] [--only CASE...]
           [--devices local-sync local-task] [--cpu host|x86-64-v3]
           [--modules DIR] [--minilm-weights FILE] [--load-seconds S]
Environment: FERRITE (the ferrite binary; default target/release/ferrite),
UPSTREAM_BIN (folder with iree-benchmark-module; default .venv/bin), VENV.
--script-load starts the same load from this script around plain
`--compare-upstream` runs instead (to time an older ferrite binary that has
no `--under-load`). With --modules DIR, the .vmfb files found there (add, chain100, mlp) are
used as they are (for a machine without the compiler).

--profile DIR records where the time goes instead of timing: for each case
and device, each runtime's `benchmark-module` writes a `host-execution`
profile bundle (upstream 3.13's `.ireeprof`; `--device_profiling_mode=
host-execution`) into DIR, idle and then under the same load, and the
pinned `iree-profile` reads all four; per dispatch export it prints the
time per workgroup (the bundle's tile time over the dispatch's
workgroups: how fast the code runs) and the dispatch time per submission
(first workgroup start to last end: how well it is spread over threads)
for both runtimes, and per submission the wall, the time no dispatch ran
(gaps) and the workgroup time in all. Recording costs time of its own
(Ferrite records each tile; under load a recording thread that loses its
CPU delays the others), so these walls are not the timings above.
--parameter-mode MODE passes `--parameter_mode=MODE` (file or preload) to
both runtimes for the MiniLM case.

--schedstat times each runtime idle and under the load as above, and while
it runs reads every thread's scheduler counters (Linux /proc/PID/task/*/:
CPU time, time waiting runnable for a CPU, voluntary and involuntary
switches) of its process and their children; it prints them per call,
summed over threads, and the threads' CPU share: how long the threads
that had work waited behind the busy processes.

--python times the same cases through Python instead: ferrite.runtime against
iree.runtime (both from this interpreter's environment), the same module,
function, numpy inputs and device, each runtime in a process of its own
(`--py-time`, so neither runtime's threads idle beside the other's), idle
and then under the same load (one busy process per CPU, started here,
settled 3 s, killed afterwards); under the load the two alternate twice
(ferrite, upstream, ferrite, upstream) and each loaded figure is the mean
of its two timings, as the CLI's `--under-load` does.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_common  # noqa: E402

VENV = os.environ.get("VENV", os.path.join(ROOT, ".venv"))
BIN = os.environ.get("UPSTREAM_BIN", os.path.join(VENV, "bin"))
FERRITE = os.environ.get("FERRITE", os.path.join(ROOT, "target", "release", "ferrite"))
BUILD = os.path.join(ROOT, "build", "bench-load")

# name, module source (benches/hal/<src>.mlir; None: MiniLM), function, inputs
CASES = [
    ("add", "add", "add", ["4xf32=1,2,3,4", "4xf32=10"]),
    ("chain100", "chain100", "chain", ["16xf32=1"]),
    ("mlp", "mlp", "mlp", ["8x128xf32=0.5"]),
    ("minilm", None, "embed", ["1x128xi64=1", "1x128xi64=1"]),
]
DEVICES = {"local-sync": ["--device=local-sync"], "local-task": ["--device=local-task"]}
# The ratio each loaded local-task case aims for (issue 25).
TARGETS = {"add/local-task": 1.0, "mlp/local-task": 1.0, "minilm/local-task": 1.0}
UNITS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
T = r"([0-9.]+) (ns|us|ms|s)"
SUMMARY = re.compile(rf"idle vs loaded: ferrite {T} / {T}, upstream {T} / {T}")
RATIO_F = re.compile(rf"^ferrite benchmark-module: {T} per call", re.M)
RATIO_U = re.compile(rf"^upstream iree-benchmark-module: {T} per call", re.M)


def log(msg):
    print(msg, flush=True)


def ns(value, unit):
    return float(value) * UNITS[unit]


def module_for(src, args):
    """The case's .vmfb: from --modules, else compiled here for --cpu."""
    if args.modules:
        return os.path.join(args.modules, src + ".vmfb")
    out = os.path.join(BUILD, args.cpu, src + ".vmfb")
    mlir = os.path.join(ROOT, "benches", "hal", src + ".mlir")
    if not (os.path.exists(out) and os.path.getmtime(out) > os.path.getmtime(mlir)):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        log(f"compiling {src}.mlir for {args.cpu}...")
        subprocess.run([os.path.join(VENV, "bin", "iree-compile"), "--iree-hal-target-device=local",
                        "--iree-hal-local-target-device-backends=llvm-cpu",
                        f"--iree-llvmcpu-target-cpu={args.cpu}", mlir, "-o", out], check=True)
    return out


def minilm_weights(args):
    if args.minilm_weights:
        return args.minilm_weights
    path = os.path.join(BUILD, "minilm_random.safetensors")
    if not os.path.exists(path):
        sys.path.insert(0, os.path.join(ROOT, "examples", "minilm"))
        import model  # noqa: E402 (numpy only)

        os.makedirs(BUILD, exist_ok=True)
        log("writing MiniLM-shaped random weights...")
        model.write_random_safetensors(path)
    return path


def run(cmd):
    env = dict(os.environ, IREE_BENCHMARK_MODULE=os.path.join(BIN, "iree-benchmark-module"))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}{p.stderr}")
    return p.stdout


# numpy inputs of each case for --python (the CLI inputs above, as arrays).
PY_INPUTS = {
    "add": lambda np: [np.array([1, 2, 3, 4], np.float32), np.full(4, 10, np.float32)],
    "chain100": lambda np: [np.ones(16, np.float32)],
    "mlp": lambda np: [np.full((8, 128), 0.5, np.float32)],
    "minilm": lambda np: [np.ones((1, 128), np.int64), np.ones((1, 128), np.int64)],
}


def py_time(args):
    """--py-time: this process loads the case's module with one runtime,
    calls the function for --min-time seconds after a warm-up and prints
    the mean ns per call (one line, `ns_per_call N`) and a checksum of the
    first call's results (`checksum X`: the sum of every result element),
    which the caller compares between the runtimes."""
    import numpy as np

    if args.py_time == "ferrite":
        import ferrite.runtime as rt
    else:
        import iree.runtime as rt
    config = rt.Config(args.py_device)
    modules = []
    if args.py_weights:
        index = rt.ParameterIndex()
        index.load(args.py_weights)
        modules.append(rt.create_io_parameters_module(config.vm_instance,
                                                      index.create_provider(scope="model")))
    modules.append(rt.VmModule.mmap(config.vm_instance, args.py_module))
    bound = rt.load_vm_modules(*modules, config=config)[-1]
    fn = bound[args.py_function]
    inputs = PY_INPUTS[args.py_case](np)
    first = fn(*inputs)
    results = first if isinstance(first, (list, tuple)) else [first]
    checksum = sum(float(np.asarray(r.to_host() if hasattr(r, "to_host") else r, np.float64).sum())
                   for r in results)
    warm_end = time.perf_counter() + min(0.2, args.min_time / 2)
    calls = 0
    while calls < 3 or time.perf_counter() < warm_end:
        fn(*inputs)
        calls += 1
    calls = 0
    t0 = time.perf_counter()
    end = t0 + args.min_time
    while True:
        fn(*inputs)
        calls += 1
        now = time.perf_counter()
        if now >= end:
            break
    print(f"ns_per_call {(now - t0) / calls * 1e9:.1f}\nchecksum {checksum!r}", flush=True)


def py_timing(runtime, name, module, weights, fn, device, args):
    """ns per call of `runtime` (ferrite or upstream) on the case, timed by
    a `--py-time` process of its own."""
    cmd = [sys.executable, os.path.abspath(__file__), "--py-time", runtime, "--py-case", name,
           "--py-module", module, "--py-function", fn, "--py-device", device,
           f"--min-time={args.min_time}"]
    if weights:
        cmd += ["--py-weights", weights]
    out = run(cmd)
    m = re.search(r"^ns_per_call ([0-9.]+)$", out, re.M)
    c = re.search(r"^checksum (\S+)$", out, re.M)
    if not (m and c):
        sys.exit(f"cannot parse: {' '.join(cmd)}\n{out}")
    return float(m.group(1)), float(c.group(1))


def py_round(name, module, weights, fn, device, args):
    """(ferrite idle, ferrite loaded, upstream idle, upstream loaded), ns per
    call through Python; loaded figures the mean of two alternated timings.
    Stops when the two runtimes' results differ."""
    sums = {}

    def timing(runtime):
        t, checksum = py_timing(runtime, name, module, weights, fn, device, args)
        sums.setdefault(runtime, checksum)
        return t

    fi = timing("ferrite")
    ui = timing("upstream")
    f, u = sums["ferrite"], sums["upstream"]
    if not abs(f - u) <= 1e-3 * max(1.0, abs(u)):
        sys.exit(f"{name} on {device}: ferrite.runtime's results sum to {f}, iree.runtime's to {u}")
    loaded = {"ferrite": [], "upstream": []}
    with bench_common.CpuLoad(args.load_seconds):
        for _ in range(2):
            for runtime in ("ferrite", "upstream"):
                loaded[runtime].append(timing(runtime))
    return fi, statistics.mean(loaded["ferrite"]), ui, statistics.mean(loaded["upstream"])


def one_round(flags, args):
    """(ferrite idle, ferrite loaded, upstream idle, upstream loaded), ns per call."""
    cmd = [FERRITE, "benchmark-module", *flags, f"--benchmark_min_time={args.min_time}s",
           "--compare-upstream"]
    if args.script_load:
        idle = run(cmd)
        with bench_common.CpuLoad(args.load_seconds):
            loaded = run(cmd)
        times = []
        for out in (idle, loaded):
            f = RATIO_F.search(out)
            u = RATIO_U.search(out)
            if not (f and u):
                sys.exit(f"cannot parse: {' '.join(cmd)}\n{out}")
            times.append((ns(*f.groups()), ns(*u.groups())))
        return times[0][0], times[1][0], times[0][1], times[1][1]
    out = run([*cmd, "--under-load", f"--load-seconds={args.load_seconds}"])
    m = SUMMARY.search(out)
    if not m:
        sys.exit(f"cannot parse: {' '.join(cmd)}\n{out}")
    g = m.groups()
    return ns(g[0], g[1]), ns(g[2], g[3]), ns(g[4], g[5]), ns(g[6], g[7])


def profile_tool():
    """The pinned `iree-profile` (beside upstream's benchmark tool, else in the venv)."""
    for d in (BIN, os.path.join(VENV, "bin")):
        path = os.path.join(d, "iree-profile")
        if os.path.exists(path):
            return path
    sys.exit(f"--profile needs upstream's iree-profile (looked in {BIN} and {VENV}/bin)")


def dispatch_events(bundle):
    """The host dispatch events of `bundle`, as `iree-profile dispatch` gives them."""
    p = subprocess.run([profile_tool(), "dispatch", "--format=jsonl", "--dispatch_events", bundle],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"iree-profile failed on {bundle}:\n{p.stderr}")
    events = [json.loads(line) for line in p.stdout.splitlines() if '"host_dispatch_event"' in line]
    return [e for e in events if e.get("valid")]


def profile_summary(events):
    """Per export: [events, workgroups, tile ns, dispatch ns] over the bundle;
    per submission: (wall ns, gap ns, tile ns). Submissions without a
    dispatch of the called function (initializers) are left out: only
    those whose dispatches' exports start with the function's name count
    (IREE names them `FUNCTION$async_dispatch_N_...` or
    `FUNCTION_dispatch_N_...`)."""
    subs = {}
    for e in events:
        subs.setdefault(e["submission_id"], []).append(e)
    per_export, walls = {}, []
    for es in subs.values():
        if any(e["key"].startswith(("_initializer", "__init")) for e in es):
            continue
        spans = sorted((e["start_host_time_ns"], e["end_host_time_ns"]) for e in es)
        covered, (cs, ce) = 0, spans[0]
        for a, b in spans[1:]:
            if a > ce:
                covered += ce - cs
                cs, ce = a, b
            else:
                ce = max(ce, b)
        covered += ce - cs
        wall = max(b for _, b in spans) - spans[0][0]
        walls.append((wall, wall - covered, sum(e["tile_duration_sum_ns"] for e in es)))
        for e in es:
            wg = e["workgroup_count"][0] * e["workgroup_count"][1] * e["workgroup_count"][2]
            row = per_export.setdefault(e["key"], [0, 0, 0, 0])
            row[0] += 1
            row[1] += wg
            row[2] += e["tile_duration_sum_ns"]
            row[3] += e["duration_ns"]
    return per_export, walls


def profile_case(name, dev, flags, args):
    """--profile: records and compares the case's per-dispatch times (see the docs above)."""
    os.makedirs(args.profile, exist_ok=True)
    tag = f"{name}-{dev}"
    bundles = {}

    def record(runtime, state):
        cmd = ([FERRITE, "benchmark-module"] if runtime == "ferrite"
               else [os.path.join(BIN, "iree-benchmark-module")])
        out = os.path.join(args.profile, f"{tag}-{runtime}-{state}.ireeprof")
        run([*cmd, *flags, f"--benchmark_min_time={args.min_time}s",
             "--device_profiling_mode=host-execution", f"--device_profiling_output={out}"])
        bundles[(runtime, state)] = profile_summary(dispatch_events(out))

    for runtime in ("ferrite", "upstream"):
        record(runtime, "idle")
    with bench_common.CpuLoad(args.load_seconds):
        for runtime in ("ferrite", "upstream"):
            record(runtime, "loaded")
    for state in ("idle", "loaded"):
        (fx, fw), (ux, uw) = bundles[("ferrite", state)], bundles[("upstream", state)]
        if not fw or not uw:
            log(f"  {tag} {state}: no submissions recorded")
            continue
        n_f, n_u = len(fw), len(uw)
        med = lambda xs, k: statistics.median(x[k] for x in xs)
        log(f"\n{tag}, {state}: per submission (median) ferrite / upstream: wall "
            f"{fmt(med(fw, 0))} / {fmt(med(uw, 0))}, no dispatch running {fmt(med(fw, 1))} / "
            f"{fmt(med(uw, 1))}, workgroup time in all {fmt(med(fw, 2))} / {fmt(med(uw, 2))} "
            f"({n_f} / {n_u} submissions)")
        log(f"  {'dispatch':<58} {'n/sub':>5} {'us/wg f':>8} {'us/wg u':>8} {'ratio':>6} "
            f"{'us/sub f':>9} {'us/sub u':>9} {'ratio':>6}")
        order = lambda k: (int(re.search(r"dispatch_(\d+)", k).group(1)) if re.search(r"dispatch_(\d+)", k)
                           else -1, k)
        for key in sorted(set(fx) | set(ux), key=order):
            f = fx.get(key, [0, 0, 0, 0])
            u = ux.get(key, [0, 0, 0, 0])
            wf = f[2] / f[1] / 1e3 if f[1] else float("nan")
            wu = u[2] / u[1] / 1e3 if u[1] else float("nan")
            sf, su = f[3] / n_f / 1e3, u[3] / n_u / 1e3
            log(f"  {key[-58:]:<58} {max(f[0] / n_f, u[0] / n_u):>5.1f} {wf:>8.1f} {wu:>8.1f} "
                f"{wf / wu if wu else float('nan'):>5.2f}x {sf:>9.1f} {su:>9.1f} "
                f"{sf / su if su else float('nan'):>5.2f}x")


def thread_counters(pid):
    """{(pid, tid): (name, run ns, runnable-wait ns, voluntary, involuntary)}
    for the threads of `pid` and its descendants (gone ones left out)."""
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            base = f"/proc/{p}/task/{tid}"
            try:
                with open(f"{base}/schedstat") as f:
                    run_ns, wait_ns = (int(x) for x in f.read().split()[:2])
                with open(f"{base}/comm") as f:
                    name = f.read().strip()
                vol = invol = 0
                with open(f"{base}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches"):
                            vol = int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches"):
                            invol = int(line.split()[1])
            except (OSError, ValueError):
                continue
            out[(p, tid)] = (name, run_ns, wait_ns, vol, invol)
    return out


def schedstat_run(cmd):
    """Runs `cmd` (a benchmark-module timing), sampling its threads' counters
    every 20 ms; returns (ns per call, iterations, {thread: last sample})."""
    env = dict(os.environ, IREE_BENCHMARK_MODULE=os.path.join(BIN, "iree-benchmark-module"))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    last = {}
    while proc.poll() is None:
        last.update(thread_counters(proc.pid))
        time.sleep(0.02)
    out = proc.stdout.read()
    m = re.search(rf"real_time\s+{T}\s+{T}\s+(\d+)", out)
    if proc.returncode != 0 or not m:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{out}")
    return ns(m.group(1), m.group(2)), int(m.group(5)), last


def schedstat_case(name, dev, flags, args):
    """--schedstat: per-call scheduler counters of both runtimes, idle and loaded."""
    tools = {"ferrite": [FERRITE, "benchmark-module"],
             "upstream": [os.path.join(BIN, "iree-benchmark-module")]}
    rows = []

    def one(runtime, state):
        per_call, iters, threads = schedstat_run(
            [*tools[runtime], *flags, f"--benchmark_min_time={args.min_time}s"])
        # Counters cover the whole process (loading, warm-up, timing): per
        # call they are upper bounds, comparable between runtimes timed
        # the same way.
        calls = max(iters, 1)
        busy = [t for t in threads.values() if t[1] > 0]
        run_ms = sum(t[1] for t in busy) / calls / 1e6
        wait_ms = sum(t[2] for t in busy) / calls / 1e6
        vol = sum(t[3] for t in busy) / calls
        invol = sum(t[4] for t in busy) / calls
        rows.append((runtime, state, per_call, run_ms, wait_ms, vol, invol, len(busy)))

    for runtime in tools:
        one(runtime, "idle")
    with bench_common.CpuLoad(args.load_seconds):
        for runtime in tools:
            one(runtime, "loaded")
    log(f"\n{name}/{dev}: per call, summed over the process's threads (whole run / timed calls)")
    log(f"  {'runtime':<9} {'state':<7} {'wall':>10} {'CPU ms':>8} {'wait ms':>8} {'wait/CPU':>8} "
        f"{'vol sw':>8} {'invol sw':>8} {'threads':>7}")
    for runtime, state, per_call, run_ms, wait_ms, vol, invol, n in rows:
        log(f"  {runtime:<9} {state:<7} {fmt(per_call):>10} {run_ms:>8.2f} {wait_ms:>8.2f} "
            f"{wait_ms / max(run_ms, 1e-9):>8.2f} {vol:>8.1f} {invol:>8.1f} {n:>7}")


def fmt(x):
    if x >= 1e6:
        return f"{x / 1e6:.2f} ms"
    if x >= 1e3:
        return f"{x / 1e3:.1f} us"
    return f"{x:.0f} ns"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds per timing")
    ap.add_argument("--only", nargs="*", help="case names to run")
    ap.add_argument("--devices", nargs="*", default=list(DEVICES))
    ap.add_argument("--cpu", default="host", help="--iree-llvmcpu-target-cpu for the modules built here")
    ap.add_argument("--modules", help="folder of prebuilt add/chain100/mlp .vmfb files")
    ap.add_argument("--minilm-weights", help="MiniLM .safetensors (scope `model`)")
    ap.add_argument("--load-seconds", type=int, default=120, help="longest life of each busy process")
    ap.add_argument("--script-load", action="store_true",
                    help="start the load here, around plain --compare-upstream runs (for ferrite "
                         "binaries without --under-load, e.g. to time an older build)")
    ap.add_argument("--profile", metavar="DIR",
                    help="record host-execution profiles idle and loaded into DIR and compare "
                         "them per dispatch instead of timing (see above)")
    ap.add_argument("--schedstat", action="store_true",
                    help="per-call scheduler counters of both runtimes' threads, idle and loaded "
                         "(Linux; see above)")
    ap.add_argument("--parameter-mode", choices=["file", "preload"],
                    help="--parameter_mode for both runtimes (MiniLM)")
    ap.add_argument("--python", action="store_true",
                    help="time through Python: ferrite.runtime vs iree.runtime (see above)")
    # One timing of one runtime, in a process of its own (used by --python).
    ap.add_argument("--py-time", choices=["ferrite", "upstream"], help=argparse.SUPPRESS)
    ap.add_argument("--py-case", choices=list(PY_INPUTS), help=argparse.SUPPRESS)
    ap.add_argument("--py-module", help=argparse.SUPPRESS)
    ap.add_argument("--py-weights", help=argparse.SUPPRESS)
    ap.add_argument("--py-function", help=argparse.SUPPRESS)
    ap.add_argument("--py-device", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.py_time:
        py_time(args)
        return
    if (args.profile or args.schedstat) and args.python:
        sys.exit("--profile and --schedstat run the CLI tools; they do not combine with --python")
    cases = [c for c in CASES if not args.only or c[0] in args.only]
    cpus = os.cpu_count()
    if args.python:
        log(f"through Python: ferrite.runtime vs iree.runtime ({sys.executable}); {cpus} CPUs, "
            f"load: {cpus} busy processes")
    else:
        log(f"ferrite: {FERRITE}; upstream: {BIN}; {cpus} CPUs, load: {cpus} busy processes")
    via = "iree.runtime" if args.python else "iree-benchmark-module"
    rows = []
    for name, src, fn, inputs in cases:
        if src is None:
            module = os.path.join(ROOT, "examples", "minilm", "minilm.vmfb")
            weights = minilm_weights(args)
            mod = [f"--module={module}", f"--parameters=model={weights}"]
            if args.parameter_mode:
                mod.append(f"--parameter_mode={args.parameter_mode}")
        else:
            module, weights = module_for(src, args), None
            mod = [f"--module={module}"]
        for dev in args.devices:
            flags = [*mod, f"--function={fn}", *[f"--input={i}" for i in inputs], *DEVICES[dev]]
            if args.profile:
                profile_case(name, dev, flags, args)
                continue
            if args.schedstat:
                schedstat_case(name, dev, flags, args)
                continue
            got = []
            for r in range(args.rounds):
                if args.python:
                    got.append(py_round(name, module, weights, fn, dev, args))
                else:
                    got.append(one_round(flags, args))
                fi, fl, ui, ul = got[-1]
                log(f"  {name}/{dev} round {r + 1}/{args.rounds}: idle {fmt(fi)} vs {fmt(ui)} "
                    f"({fi / ui:.2f}x), loaded {fmt(fl)} vs {fmt(ul)} ({fl / ul:.2f}x)")
            fi, fl, ui, ul = (statistics.median(x[k] for x in got) for k in range(4))
            rows.append((f"{name}/{dev}", fi, ui, fl, ul))
            # One row per case, idle and loaded side by side (bench.py
            # renders such an area with both column groups).
            bench_common.record(f"busy machine, idle and with {cpus} busy processes (vs {via})",
                                f"{name}/{dev}", fi / 1e3, ui / 1e3, "us/call",
                                TARGETS.get(f"{name}/{dev}"),
                                loaded=(fl / 1e3, ul / 1e3))
    if args.profile or args.schedstat:
        return
    log(f"\nmedian of {args.rounds} round(s); ratio = ferrite / upstream (lower is better); "
        f"loaded = {cpus} busy processes (one per CPU); {'through Python' if args.python else 'CLI'}")
    log(f"{'case':<22} {'idle ferrite':>13} {'idle upstream':>14} {'idle ratio':>10} "
        f"{'loaded ferrite':>15} {'loaded upstream':>16} {'loaded ratio':>12}")
    for case, fi, ui, fl, ul in rows:
        log(f"{case:<22} {fmt(fi):>13} {fmt(ui):>14} {fi / ui:>9.2f}x "
            f"{fmt(fl):>15} {fmt(ul):>16} {fl / ul:>11.2f}x")


if __name__ == "__main__":
    main()
