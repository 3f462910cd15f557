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
    # decode and decode_greedy: 7 matvecs and 2 attention kernels a layer
    # each; the LM head in decode, decode_greedy and prefill.
    assert len(CONFIG.findall(gpu)) == model.LAYERS * 18 + 3


@pytest.fixture(scope="module")
def cuda_vmfb(tmp_path_factory):
    return build_cuda.build(tmp_path_factory.mktemp("cuda") / "smollm2-cuda.vmfb", quiet=True)


def test_cuda_program_compiles(cuda_vmfb):
    assert cuda_vmfb.stat().st_size > 0


def _vm_function(dump, name):
    start = dump.index(f"vm.func @{name}(")
    return dump[start : dump.index("\n}\n", start)]


def test_cuda_decode_greedy_is_async_and_never_waits_on_the_host(cuda_vmfb):
    """decode_greedy (ferrite_llm::pipeline) follows the coarse-fences model
    and its compiled body records and queues the step without a host wait:
    a `hal.fence.await` inside it would wait for the previous step (its
    wait fence) and undo the overlap. The sync decode keeps its waits."""
    dump = subprocess.run([str(IREE_COMPILE.parent / "iree-dump-module"), str(cuda_vmfb)],
                          check=True, capture_output=True, text=True).stdout
    exports = dump[dump.index("Exported Functions:") :]
    assert re.search(r"decode_greedy\(!vm\.ref<\?>, i32, !vm\.ref<\?>, !vm\.ref<\?>\)", exports)
    assert "iree.abi.model: coarse-fences" in exports
    greedy = _vm_function(dump, "decode_greedy")
    assert greedy.count("@hal.device.queue.execute") >= 1
    assert "@hal.fence.await" not in greedy, "decode_greedy waits on the host"
    assert "@hal.fence.await" in _vm_function(dump, "decode")


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


def test_device_greedy_ids_equal_the_reference_on_both_runtimes(gguf_path, reference, gpu_math_on_cpu):  # noqa: F811
    """decode_greedy's argmax on the device (the cuda program's math on
    local-task) gives the float64 reference's greedy ids: through
    `ferrite generate` (ferrite_llm::pipeline, chosen by default when the
    program has decode_greedy; FERRITE_LLM_PIPELINE=0 chooses on the host)
    and through upstream iree.runtime's loop of the same shape
    (upstream_loop.greedy_device, a step queued ahead)."""
    import upstream_loop
    from test_llm import ferrite

    m = upstream_loop.UpstreamModel(gguf_path, "local-task", vmfb=gpu_math_on_cpu)
    assert m.has_device_greedy()
    for name, ids in PROMPTS.items():
        want, _ = reference[name]
        got, _, _ = m.greedy_device(ids, N)
        assert got == want, f"upstream, {name}: {got} != reference {want}"
        for pipeline in ("1", "0"):
            r = ferrite(f"--gguf={gguf_path}", "--device=local-task", f"--module={gpu_math_on_cpu}",
                        "--prompt_ids=" + ",".join(map(str, ids)), f"--max_tokens={N}", "--ignore_eos",
                        "--output_ids", env_extra={"FERRITE_LLM_PIPELINE": pipeline})
            got = [int(x) for x in r.stdout.split()]
            assert got == want, f"ferrite (FERRITE_LLM_PIPELINE={pipeline}), {name}: {got} != reference {want}"


def test_device_greedy_ends_like_host_sampling(gguf_path, gpu_math_on_cpu):  # noqa: F811
    """The device-greedy loop (ferrite_llm::pipeline) ends a generation as
    the host loop does: past the context, the same clear error after the
    same tokens; at the end of sequence and at a stop string, the same
    streamed text (the cuda program's math on local-task)."""
    from test_llm import PROMPT60, ferrite

    def run(pipeline, *args):
        return ferrite(f"--gguf={gguf_path}", "--device=local-task", f"--module={gpu_math_on_cpu}", *args,
                       check=False, env_extra={"FERRITE_LLM_PIPELINE": pipeline})

    ctx = ["--prompt_ids=" + ",".join(map(str, PROMPT60)), "--ignore_eos", "--context=64", "--max_tokens=10"]
    dev, host = run("1", *ctx), run("0", *ctx)
    assert dev.returncode == host.returncode == 1, (dev.stderr, host.stderr)
    assert "context of 64 positions (prompt 60 + 5 generated)" in dev.stderr, dev.stderr
    assert dev.stdout == host.stdout and "panicked" not in dev.stderr
    chat = ["--chat=What is the capital of France?", "--max_tokens=40"]
    dev, host = run("1", *chat), run("0", *chat)
    assert dev.returncode == host.returncode == 0, (dev.stderr, host.stderr)
    assert dev.stdout == host.stdout and dev.stdout.strip(), (dev.stdout, host.stdout)
    words = dev.stdout.split()
    if len(words) > 2:
        stop = [f"--stop={words[2]}"]
        assert run("1", *chat, *stop).stdout == run("0", *chat, *stop).stdout
