#!/usr/bin/env python3
"""Parameter loading: ferrite.runtime vs iree.runtime, one run, interleaved.

A program reads one large parameter (default 256 MiB of f32) from an .irpa
file in scope "model" and returns 4 of its elements. Each round, for each
runtime: index the file (memory-mapped), create the io_parameters module,
load the program (its initializer loads the parameter) and call it once.
Prints the median seconds per runtime and the ferrite / upstream ratio
(lower is better). On the CPU both runtimes import the mapped bytes, so
the time should not grow with the parameter size.

Usage: .venv/bin/python scripts/bench-parameters.py [--mib 256] [--rounds 7]
"""
import argparse
import bench_common
import os
import statistics
import subprocess
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def program(n):
    return f"""
util.global private @big = #stream.parameter.named<"model"::"big"> : tensor<{n}xf32>
func.func @head() -> tensor<4xf32> {{
  %b = util.global.load @big : tensor<{n}xf32>
  %h = tensor.extract_slice %b[0] [4] [1] : tensor<{n}xf32> to tensor<4xf32>
  return %h : tensor<4xf32>
}}
"""


def once(lib, vmfb, irpa):
    t0 = time.perf_counter()
    config = lib.Config("local-task")
    index = lib.ParameterIndex()
    index.load(irpa)
    params = lib.create_io_parameters_module(config.vm_instance, index.create_provider(scope="model"))
    module = lib.VmModule.mmap(config.vm_instance, vmfb)
    bound = lib.load_vm_modules(params, module, config=config)[-1]
    out = np.asarray(bound.head())
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    import ferrite.runtime as frt
    import iree.runtime as irt

    n = args.mib * 1024 * 1024 // 4
    with tempfile.TemporaryDirectory() as d:
        src, vmfb, irpa = (os.path.join(d, f) for f in ("p.mlir", "p.vmfb", "p.irpa"))
        with open(src, "w") as f:
            f.write(program(n))
        subprocess.run(
            [os.path.join(ROOT, ".venv/bin/iree-compile"), "--iree-hal-target-device=local",
             "--iree-hal-local-target-device-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=generic",
             src, "-o", vmfb],
            check=True,
        )
        data = np.arange(n, dtype=np.float32)
        frt.save_archive_file({"big": data}, irpa)
        del data
        times = {"ferrite": [], "upstream": []}
        for _ in range(args.rounds):
            for name, lib in (("ferrite", frt), ("upstream", irt)):
                t, out = once(lib, vmfb, irpa)
                assert np.array_equal(out, np.arange(4, dtype=np.float32)), (name, out)
                times[name].append(t)
    f, u = statistics.median(times["ferrite"]), statistics.median(times["upstream"])
    print(f"parameter {args.mib} MiB, {args.rounds} rounds (median s): ferrite {f:.4f}  upstream {u:.4f}  ratio {f / u:.2f}")
    bench_common.record("Parameters (vs iree.runtime)", f"load a {args.mib} MiB .irpa and read it back",
                        f * 1e3, u * 1e3, "ms")


if __name__ == "__main__":
    main()
