#!/usr/bin/env python3
"""Python call overhead: ferrite.runtime vs iree.runtime, one run, interleaved.

Calls a 4xf32 add with numpy inputs two ways, on local-sync and local-task,
alternating the two runtimes each round: through a SystemContext (the module
attribute looked up on every call, `ctx.modules.module.add(a, b)`) and through
a FunctionInvoker made once (`FunctionInvoker(ctx.vm_context, device, f)`).
Prints the median time per call and the ratio ferrite / upstream (lower is
better).

Usage: .venv/bin/python scripts/bench-python.py [--rounds N] [--calls N]
"""
import argparse
import bench_common
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from bench_common import compile_for_host

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = """func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


def compile_add():
    return compile_for_host(SRC, "py_add")


def per_call(fn, a, b, calls):
    for _ in range(100):
        fn(a, b)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(a, b)
    return (time.perf_counter() - t0) / calls * 1e6


def per_call_system(modules, a, b, calls):
    """As `per_call`, with the lookup a caller writes inline on every call."""
    for _ in range(100):
        modules.module.add(a, b)
    t0 = time.perf_counter()
    for _ in range(calls):
        modules.module.add(a, b)
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    import iree.runtime as up
    import ferrite.runtime as fe
    vmfb = compile_add()
    a = np.arange(4, dtype=np.float32)
    b = np.ones(4, dtype=np.float32)
    for driver in ("local-sync", "local-task"):
        paths = {}
        for name, rt in (("ferrite", fe), ("upstream", up)):
            config = rt.Config(driver)
            ctx = rt.SystemContext(vm_modules=[rt.VmModule.mmap(config.vm_instance, vmfb)], config=config)
            module = ctx.modules.module
            invoker = rt.FunctionInvoker(ctx.vm_context, config.device, module.vm_module.lookup_function("add"))
            paths.setdefault("SystemContext", {})[name] = ctx.modules
            paths.setdefault("FunctionInvoker", {})[name] = invoker
        for path, fns in paths.items():
            measure = per_call_system if path == "SystemContext" else per_call
            for name, fn in fns.items():
                got = np.asarray((fn.module.add if path == "SystemContext" else fn)(a, b).to_host())
                if not np.array_equal(got, a + b):
                    sys.exit(f"{name} {path} on {driver} computed {got}")
            times = {"ferrite": [], "upstream": []}
            for r in range(args.rounds):
                for name, fn in fns.items():
                    times[name].append(measure(fn, a, b, args.calls))
                print(f"  {driver} {path} round {r + 1}/{args.rounds}: ferrite {times['ferrite'][-1]:.2f} us, "
                      f"upstream {times['upstream'][-1]:.2f} us", flush=True)
            f, u = statistics.median(times["ferrite"]), statistics.median(times["upstream"])
            fb, ub = min(times["ferrite"]), min(times["upstream"])
            print(f"{driver} {path}: ferrite {f:.2f} us/call, upstream {u:.2f} us/call, ratio: {f / u:.2f} "
                  f"(best rounds: {fb:.2f} vs {ub:.2f} us, ratio {fb / ub:.2f})")
            bench_common.record("Python call overhead (vs iree.runtime)", f"4xf32 add, {path}, {driver}",
                                f, u, "us/call", 0.5)

if __name__ == "__main__":
    main()
