#!/usr/bin/env python3
"""Model benchmark: all-MiniLM-L6-v2 (batch 1, seq 128) under Ferrite and the
pinned upstream IREE runtime, one run, interleaved.

Latency: `ferrite benchmark-module` vs `iree-benchmark-module` on the same
.vmfb (weights inlined as constants, x86-64-v3; built here by
examples/minilm/generate.py into build/minilm/), inputs and device, rounds
alternating the two; the median of rounds and the ratio Ferrite/upstream.
Cases: local-sync, and local-task with 2 workers
(`--task_topology_group_count=2` for both).

Peak RSS (`/usr/bin/time -f %M` around one `run-module` call of each tool):
the inlined module on local-sync and local-task, the parameterized module
(examples/minilm/minilm.vmfb) with the upstream model.safetensors and with
the same weights as a 64-byte aligned .irpa (iree-convert-parameters), and
the Python APIs (`VmModule.mmap` of the inlined module and one call).

Outputs are checked identical (run-module) before timing.

Usage: scripts/bench-model.py [--rounds N] [--min-time S] [--skip-python]
       scripts/bench-model.py --params-only --params M.vmfb --weights W.safetensors
           (latency and RSS of the parameterized module only, e.g. with
           random weights from `--random-weights OUT`, where the 90 MB
           inlined module cannot be had)
Environment: FERRITE (the ferrite binary), UPSTREAM_BIN (folder with the
pinned iree-run-module / iree-benchmark-module), VENV.
"""
import argparse
import importlib.util
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.environ.get("VENV", os.path.join(ROOT, ".venv"))
BIN = os.environ.get("UPSTREAM_BIN", os.path.join(VENV, "bin"))
PYTHON = os.environ.get("PYTHON", sys.executable)
FERRITE = os.environ.get("FERRITE", os.path.join(ROOT, "target", "release", "ferrite"))
BUILD = os.path.join(ROOT, "build", "minilm")

_spec = importlib.util.spec_from_file_location("bench_hal", os.path.join(ROOT, "scripts", "bench-hal.py"))
hal = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hal)
hal.BUILD = BUILD  # run_rss writes its scratch file there
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_common  # noqa: E402

INPUTS = ["--input=1x128xi64=1", "--input=1x128xi64=1"]

PY_SNIPPET = r"""
import sys, numpy as np
rt = __import__(sys.argv[1] + ".runtime", fromlist=["runtime"])
cfg = rt.Config("local-sync")
m = rt.VmModule.mmap(cfg.vm_instance, sys.argv[2])
ctx = rt.SystemContext(vm_modules=[m], config=cfg)
ids = np.ones((1, 128), np.int64)
r = ctx.modules.module["embed"](ids, ids)
print(np.array(r.to_host()).sum())
"""


def log(msg):
    print(msg, flush=True)


def ensure_modules(args):
    if args.inline and args.params:
        return args.inline, args.params, args.weights
    sys.path.insert(0, os.path.join(ROOT, "examples", "minilm"))
    import assets

    weights, _ = assets.ensure()
    inline = os.path.join(BUILD, "minilm_inline.vmfb")
    if not os.path.exists(inline):
        log("building the constants-inlined module (examples/minilm/generate.py --inline)...")
        subprocess.run(
            [PYTHON, os.path.join(ROOT, "examples", "minilm", "generate.py"), "--no-cuda",
             "--out-dir", BUILD, "--inline", inline],
            check=True,
        )
    return inline, os.path.join(ROOT, "examples", "minilm", "minilm.vmfb"), str(weights)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=2.0, help="seconds per timed process")
    ap.add_argument("--inline", help="constants-inlined module (default: built here)")
    ap.add_argument("--params", help="parameterized module (default: the committed one)")
    ap.add_argument("--weights", help="its parameter file, scope `model`")
    ap.add_argument("--skip-python", action="store_true")
    ap.add_argument("--rss-only", action="store_true", help="skip the latency rounds")
    ap.add_argument("--quick", action="store_true", help="one round of 0.5 s (a smoke run)")
    ap.add_argument("--skip-build", action="store_true", help="use target/release/ferrite as it is")
    ap.add_argument("--params-only", action="store_true", help="bench the parameterized module only")
    ap.add_argument("--workers", type=int, nargs="*", default=[2],
                    help="local-task worker counts to time (default: 2)")
    ap.add_argument("--random-weights", metavar="OUT",
                    help="write MiniLM-shaped random weights as a .safetensors file and exit")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.min_time = 1, 0.5
    if args.random_weights:
        sys.path.insert(0, os.path.join(ROOT, "examples", "minilm"))
        import model

        model.write_random_safetensors(args.random_weights)
        log(f"wrote {args.random_weights}")
        return
    os.makedirs(BUILD, exist_ok=True)
    if not args.skip_build:
        log("building ferrite (release)...")
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "ferrite-cli"], cwd=ROOT, check=True)
    if args.params_only:
        if not (args.params and args.weights):
            sys.exit("--params-only needs --params and --weights")
        inline, params, weights = None, args.params, args.weights
        args.skip_python = True
    else:
        inline, params, weights = ensure_modules(args)
    speed_module = [f"--module={inline}"] if inline else [f"--module={params}", f"--parameters=model={weights}"]
    speed_cases = [("local-sync", ["--device=local-sync"])] + [
        (f"local-task, {w} workers", ["--device=local-task", f"--task_topology_group_count={w}"])
        for w in args.workers
    ]
    up_run = os.path.join(BIN, "iree-run-module")
    up_bench = os.path.join(BIN, "iree-benchmark-module")

    rows = []
    # Peak RSS, one run-module call each.
    rss_cases = [
        ("inlined constants, local-sync", [f"--module={inline}", "--device=local-sync"]),
        ("inlined constants, local-task", [f"--module={inline}", "--device=local-task"]),
    ] if inline else []
    rss_cases.append(("parameters (.safetensors), local-sync",
                      [f"--module={params}", f"--parameters=model={weights}", "--device=local-sync"]))
    if inline and weights.endswith(".safetensors") and os.path.exists(os.path.join(BIN, "iree-convert-parameters")):
        irpa = os.path.join(BUILD, "minilm.irpa")
        if not os.path.exists(irpa) or os.path.getmtime(irpa) < os.path.getmtime(weights):
            subprocess.run([os.path.join(BIN, "iree-convert-parameters"), f"--parameters=model={weights}",
                            f"--output={irpa}"], check=True, capture_output=True)
        rss_cases.append(("parameters (.irpa), local-sync",
                          [f"--module={params}", f"--parameters=model={irpa}", "--device=local-sync"]))
    for name, flags in rss_cases:
        common = [*flags, "--function=embed", *INPUTS]
        f_out, f_kb = hal.run_rss([FERRITE, "run-module", *common])
        u_out, u_kb = hal.run_rss([up_run, *common])
        if f_out != u_out:
            sys.exit(f"{name}: outputs differ\nferrite:\n{f_out[:400]}\nupstream:\n{u_out[:400]}")
        rows.append(("RSS", name, f_kb / 1024, u_kb / 1024))
        log(f"  RSS {name}: ferrite {f_kb / 1024:.1f} MiB, upstream {u_kb / 1024:.1f} MiB "
            f"({f_kb / u_kb:.2f}), outputs identical")
    if not args.skip_python:
        f_out, f_kb = hal.run_rss([PYTHON, "-c", PY_SNIPPET, "ferrite", inline])
        u_out, u_kb = hal.run_rss([PYTHON, "-c", PY_SNIPPET, "iree", inline])
        if f_out != u_out:
            sys.exit(f"python: outputs differ: {f_out!r} vs {u_out!r}")
        rows.append(("RSS", "Python VmModule.mmap + 1 call (inlined, local-sync)", f_kb / 1024, u_kb / 1024))
        log(f"  RSS python: ferrite {f_kb / 1024:.1f} MiB, upstream {u_kb / 1024:.1f} MiB")

    # Latency, interleaved rounds.
    for name, dev in [] if args.rss_only else speed_cases:
        common = [*speed_module, "--function=embed", *INPUTS, *dev,
                  f"--benchmark_min_time={args.min_time}s"]
        per = {"ferrite": [], "upstream": []}
        for r in range(args.rounds):
            for label in ("ferrite", "upstream") if r % 2 == 0 else ("upstream", "ferrite"):
                if label == "ferrite":
                    out, _ = hal.run_rss([FERRITE, "benchmark-module", *common])
                    per[label].append(hal.parse_ferrite(out))
                else:
                    out, _ = hal.run_rss([up_bench, *common, "--benchmark_format=json"])
                    per[label].append(hal.parse_upstream(out))
            log(f"  {name} round {r + 1}/{args.rounds}: ferrite {hal.fmt(per['ferrite'][-1])}, "
                f"upstream {hal.fmt(per['upstream'][-1])}")
        f, u = statistics.median(per["ferrite"]), statistics.median(per["upstream"])
        rows.append(("latency", name + ("" if inline else " (parameters)"), f / 1e6, u / 1e6))

    log("\n| measure | case | Ferrite | upstream | ratio |")
    log("|---|---|---|---|---|")
    for kind, name, f, u in rows:
        unit = "MiB" if kind == "RSS" else "ms"
        log(f"| {kind} | {name} | {f:.2f} {unit} | {u:.2f} {unit} | {f / u:.2f} |")
        if kind == "RSS":
            target = 0.8 if name.startswith("inlined") else 1.0
            bench_common.record("MiniLM (all-MiniLM-L6-v2, batch 1, seq 128): peak RSS of one run-module call",
                                name, f, u, unit, target=target)
        else:
            target = 1.0 if name.startswith("local-sync") else 0.9
            bench_common.record("MiniLM (all-MiniLM-L6-v2, batch 1, seq 128): latency (benchmark-module)",
                                name, f, u, unit, target=target,
                                note=f"median of {args.rounds} interleaved rounds")


if __name__ == "__main__":
    main()
