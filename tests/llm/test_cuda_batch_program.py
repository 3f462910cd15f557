"""The cuda batch program of `examples/llm/build_cuda.py --batch`, checked
without a GPU: it compiles for cuda with the pinned compiler (its
compilation configs are accepted), the CPU batch program's MLIR is the one
`build_batch_mlir()` always wrote, and the cuda program's math
(`model.build_batch_mlir(gpu=True)` with the configs removed, compiled for
llvm-cpu) gives the committed CPU batch program's greedy ids through
prefill_slot, decode_batch, decode_slot and step, on upstream
`iree.runtime`. Both programs refuse bad step calls with the same messages,
the CPU one under Ferrite's `ferrite.runtime` too (their per-row checks are
read back in one transfer: model.py, `_read_flags`).

On a GPU machine, `test_cuda_batch_program_on_a_gpu` runs the compiled cuda
batch program (FERRITE_LLM_CUDA_BATCH_VMFB, default
build/llm/smollm2_batch-cuda.vmfb, built when missing) on `cuda` under
Ferrite's `ferrite.runtime` and upstream's `iree.runtime` and compares it
with the CPU batch program on local-task: the same greedy ids. Without a
GPU it is skipped, saying so (FERRITE_REQUIRE_GPU=1: it fails instead);
scripts/gpu-build.sh's `run.sh llm` runs it.

    .venv/bin/pytest -q tests/llm/test_cuda_batch_program.py
"""

import ctypes.util
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1].parent
sys.path.insert(0, str(ROOT / "examples" / "llm"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import build_cuda  # noqa: E402
import generate  # noqa: E402
import model  # noqa: E402
from test_llm import BATCH_VMFB, PROMPTS, gguf_path  # noqa: E402,F401

IREE_COMPILE = Path(sys.executable).parent / "iree-compile"
CONFIG = re.compile(r" attrs = \{compilation_info = #iree_codegen\.compilation_info<.*?>>\} \{")
# Greedy tokens per sequence after its prompt.
STEPS = 8
# Largest logit difference between the two programs (same math, other
# summation order; logits are O(10)).
LOGIT_TOL = 2e-3


def test_cpu_batch_program_has_no_gpu_configs():
    cpu = model.build_batch_mlir()
    assert "compilation_info" not in cpu
    assert model.build_batch_mlir(gpu=False) == cpu
    gpu = model.build_batch_mlir(gpu=True)
    # decode_slot: 7 matvecs and 2 attention kernels a layer and the LM
    # head; prefill_slot: the LM head; decode_batch and step: 7 matmuls a
    # layer and the LM head each (decode_batch_wide and step_wide call them).
    layers = model.LAYERS
    assert len(CONFIG.findall(gpu)) == (layers * 9 + 1) + 1 + 2 * (layers * 7 + 1)
    assert "func.call @decode_batch(" in gpu and "func.call @step(" in gpu


def test_cuda_batch_program_compiles(tmp_path):
    out = build_cuda.build(tmp_path / "smollm2_batch-cuda.vmfb", quiet=True, batch=True)
    assert out.stat().st_size > 0


@pytest.fixture(scope="module")
def gpu_math_on_cpu(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_batch_math")
    mlir = d / "smollm2_batch_gpu_math.mlir"
    mlir.write_text(CONFIG.sub(" {", model.build_batch_mlir(gpu=True)))
    out = d / "smollm2_batch_gpu_math.vmfb"
    cmd = [str(IREE_COMPILE), *generate.CPU_FLAGS, "--iree-opt-const-expr-hoisting=false", str(mlir), "-o", str(out)]
    subprocess.run(cmd, check=True)
    return out


def _load(gguf, vmfb, runtime="iree.runtime", device="local-task"):
    rt = importlib.import_module(runtime)
    config = rt.Config(device)
    index = rt.ParameterIndex()
    index.load(str(gguf))
    params = rt.create_io_parameters_module(config.vm_instance, index.create_provider(scope="model"))
    hal = rt.create_hal_module(config.vm_instance, config.device)
    module = rt.VmModule.mmap(config.vm_instance, str(vmfb))
    return rt.SystemContext(vm_modules=[params, hal, module], config=config).modules.smollm2_batch


def _i32(v):
    return np.asarray(v, dtype=np.int32)


def _run(prog):
    """Three sequences through every entry point: prompts prefilled in
    slots 7 and 0 (prefill_slot), one joining in slot 15 through a 4-row
    step beside a decode row; STEPS greedy tokens each by 3-row
    decode_batch calls, then one decode_slot step and one step of all
    three. Returns the ids per slot and every call's logits."""
    prompts = {7: PROMPTS["chat"], 0: PROMPTS["text"], 15: PROMPTS["text"][:3]}
    # ids: each slot's generated tokens; nxt: the position its next token
    # goes to.
    ids, nxt, logits = {}, {}, []

    def take(slot, row):
        # A copy: the array may view the result's buffer, which later calls
        # reuse.
        row = np.array(row, dtype=np.float32, copy=True)
        logits.append(row)
        ids[slot].append(int(np.argmax(row)))

    def decode_rows(slots):
        toks, pos = _i32([ids[s][-1] for s in slots]), _i32([nxt[s] for s in slots])
        for s in slots:
            nxt[s] += 1
        return toks, pos

    for slot in (7, 0):
        ids[slot], nxt[slot] = [], len(prompts[slot])
        take(slot, prog.prefill_slot(slot, _i32(prompts[slot]), 0).to_host())
    # slot 0 decodes (row 0) while slot 15's 3-token prompt is prefilled
    # (rows 1-3); logits of row 0 and of the prompt's last row.
    p15 = prompts[15]
    ids[15], nxt[15] = [], len(p15)
    toks, pos = decode_rows([0])
    out = prog.step(_i32([0, 15, 15, 15]), _i32([*toks, *p15]), _i32([*pos, 0, 1, 2]), _i32([0, 3])).to_host()
    take(0, out[0])
    take(15, out[1])
    order = [7, 0, 15]
    for _ in range(STEPS):
        out = prog.decode_batch(_i32(order), *decode_rows(order)).to_host()
        for s, row in zip(order, out):
            take(s, row)
    toks, pos = decode_rows([7])
    take(7, prog.decode_slot(7, int(toks[0]), int(pos[0])).to_host())
    order = [0, 7, 15]
    toks, pos = decode_rows(order)
    out = prog.step(_i32(order), toks, pos, _i32([0, 1, 2])).to_host()
    for s, row in zip(order, out):
        take(s, row)
    return ids, logits


def test_cuda_batch_math_equals_the_cpu_batch_program(gguf_path, gpu_math_on_cpu):  # noqa: F811
    want_ids, want_logits = _run(_load(gguf_path, BATCH_VMFB))
    got_ids, got_logits = _run(_load(gguf_path, gpu_math_on_cpu))
    assert got_ids == want_ids
    err = max(float(np.abs(g - w).max()) for g, w in zip(got_logits, want_logits))
    assert err < LOGIT_TOL, f"logits differ from the CPU batch program's by {err}"


# (slots, toks, pos, out) of step calls the programs must refuse, and the
# words of the error.
STEP_REFUSALS = [
    ([3, 2], [504, 504], [0, 0], [0, 1], "sorted by (slot, position)"),
    ([2, 2], [504, 504], [4, 4], [1], "sorted by (slot, position)"),
    ([2, 2], [504, 504], [5, 4], [1], "sorted by (slot, position)"),
    ([2, 16], [504, 504], [0, 0], [1], "slot id out of range"),
    ([2, 3], [504, 504], [0, -1], [1], "position must not be negative"),
    ([2, 3], [504, 504], [0, 1024], [1], "KV cache capacity of 1024 per slot"),
    ([2, 3], [504, 49152], [0, 0], [1], "token id out of range"),
    ([2, 3], [504, 504], [0, 0], [1, 0], "out rows must be increasing"),
    ([2, 3], [504, 504], [0, 0], [2], "out rows must be increasing"),
    ([2, 3], [504, 504], [0, 0], [-1], "out rows must be increasing"),
    ([2, 3], [504, 504], [0, 0], [0, 1, 1], "out must name 1 to T rows"),
    ([2, 3], [504], [0, 0], [0], "the same length"),
]


@pytest.fixture(scope="module")
def both_programs(gguf_path, gpu_math_on_cpu):  # noqa: F811
    return {
        "cpu": _load(gguf_path, BATCH_VMFB),
        "cpu_ferrite": _load(gguf_path, BATCH_VMFB, "ferrite.runtime"),
        "gpu_math": _load(gguf_path, gpu_math_on_cpu),
    }


@pytest.mark.parametrize("which", ["cpu", "cpu_ferrite", "gpu_math"])
def test_step_refusals(both_programs, which):
    prog = both_programs[which]
    for slots, toks, pos, out, words in STEP_REFUSALS:
        with pytest.raises(Exception, match=re.escape(words)):
            prog.step(_i32(slots), _i32(toks), _i32(pos), _i32(out))
    # Valid calls still pass after refusals (a sorted 2-row prompt piece).
    r = prog.step(_i32([4, 4]), _i32([504, 3575]), _i32([0, 1]), _i32([1])).to_host()
    assert r.shape == (1, model.VOCAB)


# decode_batch and step calls the CPU program must refuse on local-task,
# where its worker threads run the kernels: (function, inputs, words). The
# program checks before its KV-cache scatter and gather (model.py,
# _refuse_unless); an earlier form ran its asserts after them and crashed
# on these bad slots (a segmentation fault under both runtimes).
LOCAL_TASK_REFUSALS = [
    ("decode_batch", ["1xi32=-1", "1xi32=504", "1xi32=0"], "slot id out of range"),
    ("decode_batch", ["1xi32=17", "1xi32=504", "1xi32=0"], "slot id out of range"),
    ("decode_batch", ["2xi32=3 100000", "2xi32=504 504", "2xi32=0 0"], "slot id out of range"),
    ("decode_batch", ["2xi32=4 4", "2xi32=504 504", "2xi32=0 1"], "a slot appears twice"),
    ("decode_batch", ["1xi32=2", "1xi32=504", "1xi32=5000"], "KV cache capacity of 1024 per slot"),
    ("step", ["2xi32=3 99", "2xi32=504 504", "2xi32=0 0", "1xi32=1"], "slot id out of range"),
    ("step", ["2xi32=-5 3", "2xi32=504 504", "2xi32=0 0", "1xi32=1"], "slot id out of range"),
]


@pytest.mark.parametrize("runtime", ["ferrite", "iree"])
def test_refusals_on_local_task_come_before_the_work(gguf_path, runtime):  # noqa: F811
    from test_llm import FERRITE

    if runtime == "ferrite":
        base = [str(FERRITE), "run-module"]
    else:
        base = [str(Path(sys.executable).parent / "iree-run-module")]
    base += [f"--module={BATCH_VMFB}", f"--parameters=model={gguf_path}", "--device=local-task"]
    for fn, inputs, words in LOCAL_TASK_REFUSALS:
        args = base + [f"--function={fn}"] + [f"--input={i}" for i in inputs]
        r = subprocess.run(args, capture_output=True, text=True, timeout=300)
        out = r.stdout + r.stderr
        assert r.returncode > 0 and words in out and "panicked" not in out, (args, r.returncode, out[-2000:])


def _gpu_present():
    return Path("/dev/nvidia0").exists() or ctypes.util.find_library("cuda") is not None


# cuda against CPU logits (other kernels, other summation order; logits are
# O(10)): as test_llm.LOGIT_TOL.
GPU_LOGIT_TOL = 0.05


@pytest.mark.parametrize("runtime", ["ferrite.runtime", "iree.runtime"])
def test_cuda_batch_program_on_a_gpu(gguf_path, runtime):  # noqa: F811
    if not _gpu_present():
        if os.environ.get("FERRITE_REQUIRE_GPU") == "1":
            pytest.fail("FERRITE_REQUIRE_GPU=1 but no NVIDIA GPU or libcuda is present")
        pytest.skip("SKIPPED cuda batch program on a GPU: no NVIDIA GPU here")
    vmfb = Path(os.environ.get("FERRITE_LLM_CUDA_BATCH_VMFB", build_cuda.DEFAULT_BATCH_OUT))
    if not vmfb.exists():
        build_cuda.build(vmfb, batch=True)
    want_ids, want_logits = _run(_load(gguf_path, BATCH_VMFB, runtime, "local-task"))
    got_ids, got_logits = _run(_load(gguf_path, vmfb, runtime, "cuda"))
    assert got_ids == want_ids
    err = max(float(np.abs(g - w).max()) for g, w in zip(got_logits, want_logits))
    assert err < GPU_LOGIT_TOL, f"cuda logits differ from the CPU batch program's by {err}"
