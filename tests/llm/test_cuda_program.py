"""The cuda program of examples/llm/build_cuda.py, checked without a GPU:
it compiles for cuda with the pinned compiler (its compilation configs are
accepted), and its math (`model.build_mlir(gpu=True)` with those configs
removed, compiled for llvm-cpu) gives the float64 reference's greedy ids with
logits within test_llm.LOGIT_TOL on upstream `iree.runtime`. On a GPU,
test_cuda.py compares the cuda program's ids with the CPU program's.

    .venv/bin/pytest -q tests/llm/test_cuda_program.py
"""

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
from test_llm import LOGIT_TOL, N, PROMPTS, gguf_path, reference  # noqa: E402,F401

IREE_COMPILE = Path(sys.executable).parent / "iree-compile"
CONFIG = re.compile(r" attrs = \{compilation_info = #iree_codegen\.compilation_info<.*?>>\} \{")


def test_cpu_program_has_no_gpu_configs():
    cpu = model.build_mlir()
    assert "compilation_info" not in cpu
    gpu = model.build_mlir(gpu=True)
    # decode: 7 matvecs and 2 attention kernels a layer, the LM head in
    # decode and prefill.
    assert len(CONFIG.findall(gpu)) == model.LAYERS * 9 + 2


def test_cuda_program_compiles(tmp_path):
    out = build_cuda.build(tmp_path / "smollm2-cuda.vmfb", quiet=True)
    assert out.stat().st_size > 0


@pytest.fixture(scope="module")
def gpu_math_on_cpu(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_math")
    mlir = d / "smollm2_gpu_math.mlir"
    mlir.write_text(CONFIG.sub(" {", model.build_mlir(gpu=True)))
    out = d / "smollm2_gpu_math.vmfb"
    cmd = [str(IREE_COMPILE), *generate.CPU_FLAGS, "--iree-opt-const-expr-hoisting=false", str(mlir), "-o", str(out)]
    subprocess.run(cmd, check=True)
    return out


def test_cuda_program_math_equals_the_reference(gguf_path, reference, gpu_math_on_cpu):  # noqa: F811
    import upstream_loop

    m = upstream_loop.UpstreamModel(gguf_path, "local-sync", vmfb=gpu_math_on_cpu)
    for name, ids in PROMPTS.items():
        got, logits, _, _ = m.greedy(ids, N, keep_logits=True)
        want, ref_logits = reference[name]
        assert got == want, f"{name}: {got} != reference {want}"
        err = np.abs(logits.astype(np.float64) - ref_logits).max()
        assert err < LOGIT_TOL, f"{name}: logits differ from the reference by {err}"


def _function(mlir, name):
    start = mlir.index(f"func.func @{name}(")
    end = mlir.index("\n  }\n", start)
    return mlir[start:end]


def test_cuda_decode_reads_its_position_from_device_memory():
    """No kernel of the cuda decode step takes the position as a constant:
    the host's %pos serves only the capacity check and the attended length
    (rounded up to model.ATTEND_ROUND); RoPE, the cache write and the mask
    read %posv, a device tensor, so a CUDA graph of the step replays with
    its nodes unchanged. The CPU program's decode still takes %pos."""
    gpu = _function(model.build_mlir(gpu=True), "decode")
    cpu = _function(model.build_mlir(), "decode")
    uses = lambda text: re.findall(r"%pos\b(?!_)", text)  # noqa: E731
    generics = lambda text: re.findall(r"linalg\.generic.*?\} -> tensor", text, re.S)  # noqa: E731
    assert not any(uses(g) for g in generics(gpu)), "a cuda decode kernel reads the host position"
    assert any(uses(g) for g in generics(cpu)), "the CPU decode's kernels read %pos (the check sees it)"
    assert gpu.count("iree_linalg_ext.scatter") == model.LAYERS, "one cache write a layer, by the device position"
    assert gpu.count("%posv") >= model.LAYERS * 3
    assert f"arith.constant {model.ATTEND_ROUND} : index" in gpu


def test_cuda_program_math_across_the_attended_rounding_and_the_capacity(gguf_path, gpu_math_on_cpu):  # noqa: F811
    """The cuda decode's formulation (device position, attended length
    rounded up to model.ATTEND_ROUND and masked, scatter cache writes) gives
    the CPU program's logits at every position of a 200-position cache,
    teacher-forced (examples/llm/check_cuda.py): past three roundings and up
    to the capacity, where the rounded length is clipped."""
    import check_cuda
    import upstream_loop

    context, steps = 200, 195
    ids = check_cuda.forced_ids(steps)
    rows = {}
    for name, vmfb in (("cpu", upstream_loop.VMFB), ("gpu_math", gpu_math_on_cpu)):
        m = upstream_loop.UpstreamModel(gguf_path, "local-sync", vmfb=vmfb, context=context)
        out = [m.prefill(ids[: check_cuda.PROMPT])]
        for i in range(steps):
            out.append(m.decode(ids[check_cuda.PROMPT + i], check_cuda.PROMPT + i))
        rows[name] = np.stack(out).astype(np.float64)
    ref, got = rows["cpu"], rows["gpu_math"]
    rel = np.abs(got - ref).max(axis=1) / np.abs(ref).max()
    assert rel.max() < 1e-4, f"step {int(rel.argmax())}: relative logit difference {rel.max():.2e}"
    assert (got.argmax(axis=1) == ref.argmax(axis=1)).all()
