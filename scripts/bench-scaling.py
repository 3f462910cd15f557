#!/usr/bin/env python3
"""local-task scaling: Ferrite vs upstream IREE over worker counts, one run, interleaved.

For each program and each worker count N, runs the same .vmfb, inputs and
parameters through `ferrite benchmark-module` and upstream's pinned
`iree-benchmark-module`, both with `--device=local-task
--task_topology_group_count=N`, alternating the two in rounds so machine
noise hits both alike. Reports the median per-call wall time, the ratio
Ferrite/upstream (lower is better) and each process's CPU time per call, as
a table, as JSON and (with matplotlib) as a PNG of time vs workers, one line
per runtime and program. Before timing, each program's outputs are checked
bit-identical between the runtimes (`run-module --output=@file.npy`).

Programs (compiled for --iree-llvmcpu-target-cpu=x86-64-v4, so both
runtimes run the same kernels on any AVX-512 host):
  encoder   MiniLM-shaped transformer encoder (6 layers, hidden 384, 12 heads,
            FFN 1536), batch 1, seq 128; its weights are parameters
            (`--parameters=model=<file>.safetensors`), random, made here
  matmul    1024x1024x1024 f32 matmul
  conv      a conv-net layer: 3x3 conv 128->128 channels on 56x56, bias, relu
  chain100  100 small dependent dispatches (benches/hal/chain100.mlir)
  encoder-lend  the encoder on Ferrite's local-task with lending to waiters
            forced on (`local-task://?lend_to_waiters=true`; the default
            since issue 25, so these rows now match the plain ones)
  chain100-lend  the same for the dispatch chain

After each program, one more Ferrite run at the largest worker count with
FERRITE_LOCAL_TASK_STATS=1 reports the share of workgroups run on worker
threads vs other threads (the waiting caller), and at the end the idle_cpu
example measures the CPU time of an idle process holding a local-task device
for 5 s.

Subcommands (the first two need the repo's .venv; `run` needs only numpy,
so it can run on a machine without the toolchain):
  prepare --dir D   compile the modules into D and copy there the release
                    `ferrite`, upstream's `iree-benchmark-module` and
                    `iree-run-module`, and this script
  run --dir D       sweep; writes D/../ or --out: scaling.json, scaling.txt
  plot --json F     draw the PNG from a sweep's JSON
  all               prepare into build/scaling, run, plot (default)

Usage: scripts/bench-scaling.py [all|prepare|run|plot] [--workers 1,2,4,8,16]
       [--rounds 3] [--min-time 0.3] [--only encoder ...]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.environ.get("VENV", os.path.join(ROOT, ".venv"))
UNITS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
TARGET_CPU = "x86-64-v4"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common  # noqa: E402

# Encoder shape (MiniLM-L6-H384).
LAYERS, SEQ, HIDDEN, HEADS, FFN = 6, 128, 384, 12, 1536
HEAD_DIM = HIDDEN // HEADS


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------- programs

def encoder_mlir():
    """The encoder as MLIR: private helpers (inlined by the compiler) and one
    public function over (1, SEQ, HIDDEN) hidden states."""
    S, H, F, NH, D = SEQ, HIDDEN, FFN, HEADS, HEAD_DIM
    out = [
        "#id2 = affine_map<(d0, d1) -> (d0, d1)>",
        "#col = affine_map<(d0, d1) -> (d1)>",
        "#row = affine_map<(d0, d1) -> (d0)>",
        "#vec = affine_map<(d0) -> (d0)>",
        "#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>",
    ]
    for l in range(LAYERS):
        for name, shape in encoder_params_of_layer(l):
            dims = "x".join(map(str, shape))
            out.append(f'util.global private @{name} = #stream.parameter.named<"model"::"{name}"> '
                       f': tensor<{dims}xf32>')
    for k, n in ((H, H), (H, F), (F, H)):
        out.append(f"""
func.func private @linear_{k}_{n}(%x: tensor<{S}x{k}xf32>, %w: tensor<{k}x{n}xf32>, %b: tensor<{n}xf32>) -> tensor<{S}x{n}xf32> {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<{S}x{n}xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<{S}x{n}xf32>) -> tensor<{S}x{n}xf32>
  %m = linalg.matmul ins(%x, %w : tensor<{S}x{k}xf32>, tensor<{k}x{n}xf32>) outs(%f : tensor<{S}x{n}xf32>) -> tensor<{S}x{n}xf32>
  %r = linalg.generic {{indexing_maps = [#id2, #col, #id2], iterator_types = ["parallel", "parallel"]}}
      ins(%m, %b : tensor<{S}x{n}xf32>, tensor<{n}xf32>) outs(%e : tensor<{S}x{n}xf32>) {{
  ^bb0(%a: f32, %c: f32, %o: f32):
    %s = arith.addf %a, %c : f32
    linalg.yield %s : f32
  }} -> tensor<{S}x{n}xf32>
  return %r : tensor<{S}x{n}xf32>
}}""")
    out.append(f"""
func.func private @gelu(%x: tensor<{S}x{F}xf32>) -> tensor<{S}x{F}xf32> {{
  %e = tensor.empty() : tensor<{S}x{F}xf32>
  %r = linalg.generic {{indexing_maps = [#id2, #id2], iterator_types = ["parallel", "parallel"]}}
      ins(%x : tensor<{S}x{F}xf32>) outs(%e : tensor<{S}x{F}xf32>) {{
  ^bb0(%a: f32, %o: f32):
    %half = arith.constant 0.5 : f32
    %one = arith.constant 1.0 : f32
    %rs2 = arith.constant 0.70710678 : f32
    %t = arith.mulf %a, %rs2 : f32
    %er = math.erf %t : f32
    %p = arith.addf %er, %one : f32
    %h = arith.mulf %a, %half : f32
    %y = arith.mulf %h, %p : f32
    linalg.yield %y : f32
  }} -> tensor<{S}x{F}xf32>
  return %r : tensor<{S}x{F}xf32>
}}

func.func private @layernorm(%x: tensor<{S}x{H}xf32>, %g: tensor<{H}xf32>, %b: tensor<{H}xf32>) -> tensor<{S}x{H}xf32> {{
  %zero = arith.constant 0.0 : f32
  %e1 = tensor.empty() : tensor<{S}xf32>
  %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<{S}xf32>) -> tensor<{S}xf32>
  %sum = linalg.generic {{indexing_maps = [#id2, #row], iterator_types = ["parallel", "reduction"]}}
      ins(%x : tensor<{S}x{H}xf32>) outs(%z1 : tensor<{S}xf32>) {{
  ^bb0(%a: f32, %acc: f32):
    %s = arith.addf %a, %acc : f32
    linalg.yield %s : f32
  }} -> tensor<{S}xf32>
  %mean = linalg.generic {{indexing_maps = [#vec, #vec], iterator_types = ["parallel"]}}
      ins(%sum : tensor<{S}xf32>) outs(%e1 : tensor<{S}xf32>) {{
  ^bb0(%a: f32, %o: f32):
    %n = arith.constant {float(H)} : f32
    %m = arith.divf %a, %n : f32
    linalg.yield %m : f32
  }} -> tensor<{S}xf32>
  %var = linalg.generic {{indexing_maps = [#id2, #row, #row], iterator_types = ["parallel", "reduction"]}}
      ins(%x, %mean : tensor<{S}x{H}xf32>, tensor<{S}xf32>) outs(%z1 : tensor<{S}xf32>) {{
  ^bb0(%a: f32, %m: f32, %acc: f32):
    %d = arith.subf %a, %m : f32
    %d2 = arith.mulf %d, %d : f32
    %s = arith.addf %d2, %acc : f32
    linalg.yield %s : f32
  }} -> tensor<{S}xf32>
  %e = tensor.empty() : tensor<{S}x{H}xf32>
  %r = linalg.generic {{indexing_maps = [#id2, #row, #row, #col, #col, #id2], iterator_types = ["parallel", "parallel"]}}
      ins(%x, %mean, %var, %g, %b : tensor<{S}x{H}xf32>, tensor<{S}xf32>, tensor<{S}xf32>, tensor<{H}xf32>, tensor<{H}xf32>)
      outs(%e : tensor<{S}x{H}xf32>) {{
  ^bb0(%a: f32, %m: f32, %v: f32, %gg: f32, %bb: f32, %o: f32):
    %n = arith.constant {float(H)} : f32
    %eps = arith.constant 1.0e-12 : f32
    %d = arith.subf %a, %m : f32
    %vn = arith.divf %v, %n : f32
    %ve = arith.addf %vn, %eps : f32
    %rs = math.rsqrt %ve : f32
    %y0 = arith.mulf %d, %rs : f32
    %y1 = arith.mulf %y0, %gg : f32
    %y = arith.addf %y1, %bb : f32
    linalg.yield %y : f32
  }} -> tensor<{S}x{H}xf32>
  return %r : tensor<{S}x{H}xf32>
}}

func.func private @heads(%x: tensor<{S}x{H}xf32>) -> tensor<{NH}x{S}x{D}xf32> {{
  %x3 = tensor.expand_shape %x [[0], [1, 2]] output_shape [{S}, {NH}, {D}] : tensor<{S}x{H}xf32> into tensor<{S}x{NH}x{D}xf32>
  %e = tensor.empty() : tensor<{NH}x{S}x{D}xf32>
  %t = linalg.transpose ins(%x3 : tensor<{S}x{NH}x{D}xf32>) outs(%e : tensor<{NH}x{S}x{D}xf32>) permutation = [1, 0, 2]
  return %t : tensor<{NH}x{S}x{D}xf32>
}}

func.func private @attention(%q: tensor<{S}x{H}xf32>, %k: tensor<{S}x{H}xf32>, %v: tensor<{S}x{H}xf32>) -> tensor<{S}x{H}xf32> {{
  %zero = arith.constant 0.0 : f32
  %qh = call @heads(%q) : (tensor<{S}x{H}xf32>) -> tensor<{NH}x{S}x{D}xf32>
  %vh = call @heads(%v) : (tensor<{S}x{H}xf32>) -> tensor<{NH}x{S}x{D}xf32>
  %k3 = tensor.expand_shape %k [[0], [1, 2]] output_shape [{S}, {NH}, {D}] : tensor<{S}x{H}xf32> into tensor<{S}x{NH}x{D}xf32>
  %ekt = tensor.empty() : tensor<{NH}x{D}x{S}xf32>
  %kt = linalg.transpose ins(%k3 : tensor<{S}x{NH}x{D}xf32>) outs(%ekt : tensor<{NH}x{D}x{S}xf32>) permutation = [1, 2, 0]
  %es = tensor.empty() : tensor<{NH}x{S}x{S}xf32>
  %zs = linalg.fill ins(%zero : f32) outs(%es : tensor<{NH}x{S}x{S}xf32>) -> tensor<{NH}x{S}x{S}xf32>
  %s = linalg.batch_matmul ins(%qh, %kt : tensor<{NH}x{S}x{D}xf32>, tensor<{NH}x{D}x{S}xf32>) outs(%zs : tensor<{NH}x{S}x{S}xf32>) -> tensor<{NH}x{S}x{S}xf32>
  %sc = linalg.generic {{indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}}
      ins(%s : tensor<{NH}x{S}x{S}xf32>) outs(%es : tensor<{NH}x{S}x{S}xf32>) {{
  ^bb0(%a: f32, %o: f32):
    %scale = arith.constant {1.0 / D ** 0.5} : f32
    %y = arith.mulf %a, %scale : f32
    linalg.yield %y : f32
  }} -> tensor<{NH}x{S}x{S}xf32>
  %p = linalg.softmax dimension(2) ins(%sc : tensor<{NH}x{S}x{S}xf32>) outs(%es : tensor<{NH}x{S}x{S}xf32>) -> tensor<{NH}x{S}x{S}xf32>
  %ec = tensor.empty() : tensor<{NH}x{S}x{D}xf32>
  %zc = linalg.fill ins(%zero : f32) outs(%ec : tensor<{NH}x{S}x{D}xf32>) -> tensor<{NH}x{S}x{D}xf32>
  %c = linalg.batch_matmul ins(%p, %vh : tensor<{NH}x{S}x{S}xf32>, tensor<{NH}x{S}x{D}xf32>) outs(%zc : tensor<{NH}x{S}x{D}xf32>) -> tensor<{NH}x{S}x{D}xf32>
  %et = tensor.empty() : tensor<{S}x{NH}x{D}xf32>
  %ct = linalg.transpose ins(%c : tensor<{NH}x{S}x{D}xf32>) outs(%et : tensor<{S}x{NH}x{D}xf32>) permutation = [1, 0, 2]
  %r = tensor.collapse_shape %ct [[0], [1, 2]] : tensor<{S}x{NH}x{D}xf32> into tensor<{S}x{H}xf32>
  return %r : tensor<{S}x{H}xf32>
}}""")
    body = [f"func.func @encoder(%in: tensor<1x{S}x{H}xf32>) -> tensor<1x{S}x{H}xf32> {{",
            f"  %x0 = tensor.collapse_shape %in [[0, 1], [2]] : tensor<1x{S}x{H}xf32> into tensor<{S}x{H}xf32>"]
    t = lambda *d: "tensor<" + "x".join(map(str, d)) + "xf32>"
    for l in range(LAYERS):
        p = f"l{l}_"
        for name, shape in encoder_params_of_layer(l):
            body.append(f"  %{name} = util.global.load @{name} : {t(*shape)}")
        x = f"%x{l}"
        for proj in "qkv":
            body.append(f"  %{p}{proj} = call @linear_{H}_{H}({x}, %{p}w{proj}, %{p}b{proj}) : "
                        f"({t(S, H)}, {t(H, H)}, {t(H)}) -> {t(S, H)}")
        body += [
            f"  %{p}att = call @attention(%{p}q, %{p}k, %{p}v) : ({t(S, H)}, {t(S, H)}, {t(S, H)}) -> {t(S, H)}",
            f"  %{p}o = call @linear_{H}_{H}(%{p}att, %{p}wo, %{p}bo) : ({t(S, H)}, {t(H, H)}, {t(H)}) -> {t(S, H)}",
            f"  %{p}r1 = arith.addf {x}, %{p}o : {t(S, H)}",
            f"  %{p}n1 = call @layernorm(%{p}r1, %{p}ln1_g, %{p}ln1_b) : ({t(S, H)}, {t(H)}, {t(H)}) -> {t(S, H)}",
            f"  %{p}h = call @linear_{H}_{F}(%{p}n1, %{p}w1, %{p}b1) : ({t(S, H)}, {t(H, F)}, {t(F)}) -> {t(S, F)}",
            f"  %{p}g = call @gelu(%{p}h) : ({t(S, F)}) -> {t(S, F)}",
            f"  %{p}f = call @linear_{F}_{H}(%{p}g, %{p}w2, %{p}b2) : ({t(S, F)}, {t(F, H)}, {t(H)}) -> {t(S, H)}",
            f"  %{p}r2 = arith.addf %{p}n1, %{p}f : {t(S, H)}",
            f"  %x{l + 1} = call @layernorm(%{p}r2, %{p}ln2_g, %{p}ln2_b) : ({t(S, H)}, {t(H)}, {t(H)}) -> {t(S, H)}",
        ]
    body += [f"  %out = tensor.expand_shape %x{LAYERS} [[0, 1], [2]] output_shape [1, {S}, {H}] : "
             f"{t(S, H)} into {t(1, S, H)}",
             f"  return %out : {t(1, S, H)}", "}"]
    return "\n".join(out + [""] + body) + "\n"


def encoder_params_of_layer(l):
    H, F = HIDDEN, FFN
    p = f"l{l}_"
    return [(p + "wq", (H, H)), (p + "bq", (H,)), (p + "wk", (H, H)), (p + "bk", (H,)),
            (p + "wv", (H, H)), (p + "bv", (H,)), (p + "wo", (H, H)), (p + "bo", (H,)),
            (p + "ln1_g", (H,)), (p + "ln1_b", (H,)), (p + "w1", (H, F)), (p + "b1", (F,)),
            (p + "w2", (F, H)), (p + "b2", (H,)), (p + "ln2_g", (H,)), (p + "ln2_b", (H,))]


CONV_MLIR = """
#nhwc = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#bias = affine_map<(d0, d1, d2, d3) -> (d3)>
func.func @conv(%x: tensor<1x58x58x128xf32>, %w: tensor<3x3x128x128xf32>, %b: tensor<128xf32>) -> tensor<1x56x56x128xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x56x56x128xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<1x56x56x128xf32>) -> tensor<1x56x56x128xf32>
  %c = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
      ins(%x, %w : tensor<1x58x58x128xf32>, tensor<3x3x128x128xf32>) outs(%f : tensor<1x56x56x128xf32>) -> tensor<1x56x56x128xf32>
  %r = linalg.generic {indexing_maps = [#nhwc, #bias, #nhwc], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%c, %b : tensor<1x56x56x128xf32>, tensor<128xf32>) outs(%e : tensor<1x56x56x128xf32>) {
  ^bb0(%a: f32, %bb: f32, %o: f32):
    %s = arith.addf %a, %bb : f32
    %y = arith.maximumf %s, %zero : f32
    linalg.yield %y : f32
  } -> tensor<1x56x56x128xf32>
  return %r : tensor<1x56x56x128xf32>
}
"""

# name -> (function, [(input name, shape)], min_time override)
PROGRAMS = {
    "encoder": ("encoder", [("hidden", (1, SEQ, HIDDEN))]),
    "matmul": ("matmul", [("a", (1024, 1024)), ("b", (1024, 1024))]),
    "conv": ("conv", [("x", (1, 58, 58, 128)), ("w", (3, 3, 128, 128)), ("b", (128,))]),
    "chain100": ("chain", [("x", (16,))]),
}


def sources():
    with open(os.path.join(ROOT, "benches", "hal", "matmul.mlir")) as f:
        matmul = f.read()
    with open(os.path.join(ROOT, "benches", "hal", "chain100.mlir")) as f:
        chain = f.read()
    return {"encoder": encoder_mlir(), "matmul": matmul, "conv": CONV_MLIR, "chain100": chain}


def prepare(d):
    os.makedirs(d, exist_ok=True)
    compile_ = os.path.join(VENV, "bin", "iree-compile")
    for name, text in sources().items():
        src = os.path.join(d, name + ".mlir")
        with open(src, "w") as f:
            f.write(text)
        log(f"compiling {name} for {TARGET_CPU}...")
        subprocess.run([compile_, "--iree-hal-target-device=local",
                        "--iree-hal-local-target-device-backends=llvm-cpu",
                        f"--iree-llvmcpu-target-cpu={TARGET_CPU}", src,
                        "-o", os.path.join(d, name + ".vmfb")], check=True)
        os.remove(src)
    log("building ferrite (release)...")
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "ferrite-cli"], cwd=ROOT, check=True)
    shutil.copy(os.path.join(ROOT, "target", "release", "ferrite"), d)
    idle = os.path.join(ROOT, "target", "release", "examples", "idle_cpu")
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "ferrite-hal-cpu", "--example", "idle_cpu"],
                   cwd=ROOT, check=True)
    shutil.copy(idle, d)
    # Upstream's tools are the pinned runtime wheel's native executables.
    import glob
    libs = glob.glob(os.path.join(VENV, "lib", "python*", "site-packages", "iree", "_runtime_libs"))
    if not libs:
        sys.exit(f"no iree/_runtime_libs under {VENV}: run scripts/setup-venv.sh")
    for tool in ("iree-benchmark-module", "iree-run-module"):
        shutil.copy(os.path.join(libs[0], tool), d)
    shutil.copy(os.path.abspath(__file__), d)
    log(f"prepared {d}")


# ---------------------------------------------------------------- data

def write_safetensors(path, tensors):
    """A safetensors file whose tensors all start 64-byte aligned (every
    tensor here is a multiple of 64 bytes; the header is padded)."""
    import numpy as np
    header, offset = {}, 0
    for name, arr in tensors:
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 64)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for _, arr in tensors:
            f.write(np.ascontiguousarray(arr, dtype=np.float32).tobytes())


def make_data(d):
    """Random inputs (.npy) and encoder weights (.safetensors) in d/data."""
    import numpy as np
    data = os.path.join(d, "data")
    os.makedirs(data, exist_ok=True)
    rng = np.random.default_rng(14)
    inputs = {}
    for prog, (_, ins) in PROGRAMS.items():
        inputs[prog] = []
        for name, shape in ins:
            path = os.path.join(data, f"{prog}_{name}.npy")
            if not os.path.exists(path):
                np.save(path, rng.standard_normal(shape, dtype=np.float32))
            inputs[prog].append(f"@{path}")
    weights = os.path.join(data, "encoder.safetensors")
    if not os.path.exists(weights):
        tensors = []
        for l in range(LAYERS):
            for name, shape in encoder_params_of_layer(l):
                if name.endswith("_g"):
                    arr = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
                elif len(shape) == 1:
                    arr = 0.02 * rng.standard_normal(shape, dtype=np.float32)
                else:
                    arr = rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[0])
                tensors.append((name, arr.astype(np.float32)))
        write_safetensors(weights, tensors)
    return inputs, {"encoder": [f"--parameters=model={weights}"]}


# ---------------------------------------------------------------- running

def cpu_seconds_of(cmd):
    """Runs cmd, returns (stdout, child CPU seconds)."""
    before = os.times()
    p = subprocess.run(cmd, capture_output=True, text=True)
    after = os.times()
    if p.returncode != 0:
        sys.exit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}{p.stderr}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return p.stdout, cpu


def parse_json_report(out):
    """Mean per-call real time (ns) and iteration count of a google-benchmark
    JSON report (both runtimes write one with --benchmark_format=json)."""
    doc = json.loads(out[out.index("{"):])
    runs = [b for b in doc["benchmarks"] if b.get("run_type", "iteration") == "iteration"]
    if not runs:
        sys.exit(f"no iteration rows in report:\n{out}")
    t = statistics.mean(b["real_time"] * UNITS[b["time_unit"]] for b in runs)
    iters = sum(int(b["iterations"]) for b in runs)
    return t, iters


def check_same_outputs(d, tools, prog, common):
    """run-module on both runtimes writing .npy outputs; they must be equal bytes."""
    import numpy as np
    outs = {}
    for label in ("ferrite", "upstream"):
        path = os.path.join(d, "data", f"{prog}_out_{label}.npy")
        if os.path.exists(path):
            os.remove(path)
        subprocess.run([*tools[label]["run"], *common, f"--output=@{path}"], check=True,
                       capture_output=True)
        outs[label] = np.load(path)
    f, u = outs["ferrite"], outs["upstream"]
    same = f.shape == u.shape and f.dtype == u.dtype and f.tobytes() == u.tobytes()
    if not same:
        sys.exit(f"{prog}: outputs differ between runtimes (max abs diff "
                 f"{np.max(np.abs(f.astype(np.float64) - u)) if f.shape == u.shape else 'shape'})")
    log(f"{prog}: outputs bit-identical ({f.shape}, {f.dtype})")


# Extra Ferrite configurations timed like a program: name -> (program,
# Ferrite --device). Upstream runs its plain local-task for them.
VARIANTS = {"encoder-lend": ("encoder", "local-task://?lend_to_waiters=true"),
            "chain100-lend": ("chain100", "local-task://?lend_to_waiters=true")}


def worker_share(d, tools, common, n):
    """One short Ferrite benchmark with FERRITE_LOCAL_TASK_STATS set: the
    device's scheduler statistics line (workgroups on workers vs others)."""
    env = dict(os.environ, FERRITE_LOCAL_TASK_STATS="1")
    p = subprocess.run([*tools["ferrite"]["bench"], *common, "--device=local-task",
                        f"--task_topology_group_count={n}", "--benchmark_min_time=0.2s"],
                       capture_output=True, text=True, env=env)
    lines = [l for l in p.stderr.splitlines() if l.startswith("local-task stats:")]
    return lines[-1] if lines else f"(no stats; rc {p.returncode}: {p.stderr.strip()[-300:]})"


def run_sweep(d, workers, rounds, min_time, only, out_dir):
    inputs, extra = make_data(d)
    tools = {
        "ferrite": {"bench": [os.path.join(d, "ferrite"), "benchmark-module"],
                    "run": [os.path.join(d, "ferrite"), "run-module"]},
        "upstream": {"bench": [os.path.join(d, "iree-benchmark-module")],
                     "run": [os.path.join(d, "iree-run-module")]},
    }
    results = {"host": os.uname().nodename, "cpus": os.cpu_count(), "workers": workers,
               "rounds": rounds, "min_time": min_time, "programs": {}}
    progs = [p for p in [*PROGRAMS, *VARIANTS] if not only or p in only]
    total = len(progs) * len(workers)
    step = 0
    t0 = time.time()
    results["worker_share"] = {}
    for prog in progs:
        base, ferrite_device = VARIANTS.get(prog, (prog, "local-task"))
        fn, _ = PROGRAMS[base]
        vmfb = os.path.join(d, base + ".vmfb")
        common = [f"--module={vmfb}", f"--function={fn}", *[f"--input={i}" for i in inputs[base]],
                  *extra.get(base, [])]
        if prog == base:
            check_same_outputs(d, tools, prog, [*common, "--device=local-task",
                                                "--task_topology_group_count=2"])
        rows = {}
        for n in workers:
            step += 1
            devs = {"ferrite": [f"--device={ferrite_device}", f"--task_topology_group_count={n}"],
                    "upstream": ["--device=local-task", f"--task_topology_group_count={n}"]}
            per = {"ferrite": [], "upstream": []}
            cpu = {"ferrite": [], "upstream": []}
            for r in range(rounds):
                for label in ("ferrite", "upstream") if r % 2 == 0 else ("upstream", "ferrite"):
                    cmd = [*tools[label]["bench"], *common, *devs[label], f"--benchmark_min_time={min_time}s",
                           "--benchmark_format=json"]
                    out, cpu_s = cpu_seconds_of(cmd)
                    t, iters = parse_json_report(out)
                    per[label].append(t)
                    # CPU time of the whole process (load, warm-up included)
                    # over its timed calls: an upper bound per call.
                    cpu[label].append(cpu_s * 1e9 / max(iters, 1))
            f, u = statistics.median(per["ferrite"]), statistics.median(per["upstream"])
            rows[n] = {"ferrite_ns": f, "upstream_ns": u, "ratio": f / u,
                       "ferrite_cpu_ns": statistics.median(cpu["ferrite"]),
                       "upstream_cpu_ns": statistics.median(cpu["upstream"]),
                       "ferrite_all": per["ferrite"], "upstream_all": per["upstream"]}
            log(f"[{step}/{total}, {time.time() - t0:.0f}s] {prog} workers={n}: ferrite {fmt(f)}, "
                f"upstream {fmt(u)}, ratio {f / u:.2f} (cpu/call {fmt(rows[n]['ferrite_cpu_ns'])} vs "
                f"{fmt(rows[n]['upstream_cpu_ns'])})")
        results["programs"][prog] = rows
        for n, r in rows.items():
            target = (0.8 if n >= 8 else 1.0) if prog == "encoder" else (1.0 if prog == base else None)
            bench_common.record(f"local-task scaling on {os.cpu_count()} CPUs (benchmark-module)",
                                f"{prog}, {n} workers", r["ferrite_ns"] / 1e6, r["upstream_ns"] / 1e6, "ms",
                                target=target, note=f"median of {rounds} interleaved rounds")
        if prog == base:
            n = max(workers)
            results["worker_share"][prog] = worker_share(d, tools, common, n)
            log(f"{prog} workers={n}: {results['worker_share'][prog]}")
    idle = os.path.join(d, "idle_cpu")
    if os.path.exists(idle):
        p = subprocess.run([idle, str(max(workers))], capture_output=True, text=True)
        results["idle"] = p.stdout.strip() or p.stderr.strip()
        log(f"idle: {results['idle']}")
    table = ratio_table(results)
    log("\n" + table)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "scaling.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out_dir, "scaling.txt"), "w") as f:
        f.write(table + "\n")
    return results


def fmt(ns):
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} us"
    return f"{ns:.0f} ns"


def paired_ratio(row):
    """Median over rounds of Ferrite's time / upstream's in the same round:
    runs taken seconds apart, so it follows the machine's drift less than
    the ratio of the two medians does."""
    return statistics.median(f / u for f, u in zip(row["ferrite_all"], row["upstream_all"]))


def ratio_table(results):
    workers = results["workers"]
    lines = [f"ratio ferrite/upstream (lower is better), local-task, {results['cpus']} CPUs: "
             f"ratio of the medians of {results['rounds']} rounds (the medians; paired: the median "
             f"of the per-round ratios)",
             "| program | " + " | ".join(str(n) for n in workers) + " |",
             "|---|" + "---|" * len(workers)]
    for prog, rows in results["programs"].items():
        cells = []
        for n in workers:
            r = rows.get(n) or rows.get(str(n))
            cells.append(f"{r['ratio']:.2f} ({fmt(r['ferrite_ns'])} / {fmt(r['upstream_ns'])}; "
                         f"paired {paired_ratio(r):.2f})")
        lines.append(f"| {prog} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(json_path, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        log("SKIPPED: plot needs matplotlib (pip install matplotlib)")
        return
    with open(json_path) as f:
        results = json.load(f)
    progs = [p for p in results["programs"] if p not in VARIANTS]
    fig, axes = plt.subplots(1, len(progs), figsize=(4.2 * len(progs), 4))
    if len(progs) == 1:
        axes = [axes]
    for ax, prog in zip(axes, progs):
        rows = results["programs"][prog]
        ns = sorted(int(n) for n in rows)
        for label, style in (("ferrite", "o-"), ("upstream", "s--")):
            ys = [rows[str(n)][f"{label}_ns"] / 1e6 for n in ns]
            ax.plot(ns, ys, style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ns)
        ax.set_xticklabels([str(n) for n in ns])
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(prog)
        ax.set_xlabel("workers (--task_topology_group_count)")
        ax.set_ylabel("ms per call")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"local-task scaling on {results['cpus']} CPUs: time per call vs workers")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    log(f"wrote {png}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", nargs="?", default="all", choices=["all", "prepare", "run", "plot"])
    ap.add_argument("--dir", default=os.path.join(ROOT, "build", "scaling"))
    ap.add_argument("--out", help="where run writes scaling.json/.txt (default: --dir)")
    ap.add_argument("--workers", default=None, help="comma-separated worker counts")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds per timed process")
    ap.add_argument("--only", nargs="*", help="programs to run")
    ap.add_argument("--json", help="plot: the sweep's JSON (default: DIR/scaling.json)")
    ap.add_argument("--png", default=os.path.join(ROOT, "benches", "scaling.png"))
    ap.add_argument("--quick", action="store_true", help="one round of 0.1 s per point (a smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.min_time = 1, 0.1
    if args.workers:
        workers = [int(w) for w in args.workers.split(",")]
    else:
        cpus = os.cpu_count() or 1
        workers = [n for n in (1, 2, 4, 8, 16) if n <= cpus] or [1]
    out_dir = args.out or args.dir
    if args.command in ("all", "prepare"):
        prepare(args.dir)
    if args.command in ("all", "run"):
        run_sweep(args.dir, workers, args.rounds, args.min_time, args.only, out_dir)
    if args.command in ("all", "plot"):
        plot(args.json or os.path.join(out_dir, "scaling.json"), args.png)


if __name__ == "__main__":
    main()
