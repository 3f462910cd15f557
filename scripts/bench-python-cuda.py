#!/usr/bin/env python3
"""Python call overhead on cuda: `add(x, y).to_host()` of a 4xf32 add
through the system API (SystemContext, the bound function), ferrite.runtime
against iree.runtime, interleaved rounds on the same module and GPU.

Usage (on a machine with an NVIDIA GPU, both packages importable):
    python3 scripts/bench-python-cuda.py ADD_VMFB
ADD_VMFB: benches/hal/add.mlir compiled for cuda, e.g.
    iree-compile --iree-hal-target-device=cuda --iree-cuda-target=sm_80 benches/hal/add.mlir -o add.vmfb
"""
import sys, time, statistics, importlib
import numpy as np
vmfb = sys.argv[1]
def bench(modname, calls=2000):
    rt = importlib.import_module(modname)
    dev = rt.get_device("cuda")
    ctx = rt.SystemContext(config=rt.Config(device=dev))
    with open(vmfb, "rb") as f:
        ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, f.read()))
    add = ctx.modules.module["add"]
    x = np.array([1, 2, 3, 4], dtype=np.float32); y = np.full(4, 10, np.float32)
    for _ in range(200):
        r = add(x, y).to_host()
    assert (r == x + y).all()
    t = time.perf_counter()
    for _ in range(calls):
        add(x, y).to_host()
    return (time.perf_counter() - t) / calls * 1e6
res = {"ferrite.runtime": [], "iree.runtime": []}
for r in range(5):
    for m in (["ferrite.runtime", "iree.runtime"] if r % 2 == 0 else ["iree.runtime", "ferrite.runtime"]):
        res[m].append(bench(m))
f, u = statistics.median(res["ferrite.runtime"]), statistics.median(res["iree.runtime"])
print(f"python add(x, y).to_host() on cuda: ferrite {f:.1f} us, upstream {u:.1f} us, ratio {f/u:.2f} (median of 5 interleaved rounds of 2000 calls)")
