"""SmolLM2-135M on `cuda` (GPU machines): the program compiled for cuda by
examples/llm/build_cuda.py gives the same greedy ids as the CPU program on
local-sync (which test_llm.py checks against the float64 reference), through
the CLI, Python `ferrite.llm` and upstream `iree.runtime`.

    .venv/bin/pytest -q -rs tests/llm/test_cuda.py     (FERRITE_REQUIRE_GPU=1: fail
                                                         instead of skipping without a GPU)

Without a GPU every test is skipped, saying so. The cuda program is built
into build/llm/smollm2-cuda.vmfb when missing (FERRITE_LLM_CUDA_VMFB names
another).
"""

import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "llm"))

import assets  # noqa: E402
import build_cuda  # noqa: E402

FERRITE = Path(os.environ.get("FERRITE_BIN", ROOT / "target" / "debug" / "ferrite"))
N = 16
PROMPTS = {
    "chat": [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
    "text": [504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 8590, 314],
}


def _gpu_present():
    return Path("/dev/nvidia0").exists() or ctypes.util.find_library("cuda") is not None


if not _gpu_present():
    if os.environ.get("FERRITE_REQUIRE_GPU") == "1":
        raise RuntimeError("FERRITE_REQUIRE_GPU=1 but no NVIDIA GPU or libcuda is present")
    pytest.skip("SKIPPED LLM cuda tests: no NVIDIA GPU here", allow_module_level=True)


@pytest.fixture(scope="module")
def gguf_path():
    return assets.ensure(quiet=True)


@pytest.fixture(scope="module")
def cuda_vmfb():
    path = Path(os.environ.get("FERRITE_LLM_CUDA_VMFB", build_cuda.DEFAULT_OUT))
    if not path.exists():
        build_cuda.build(path)
    return path


def cli_ids(gguf, ids, device, module=None, n=N, pipeline=None):
    cmd = [str(FERRITE), "generate", f"--gguf={gguf}", "--prompt_ids=" + ",".join(map(str, ids)),
           f"--max_tokens={n}", "--ignore_eos", "--output_ids", f"--device={device}"]
    if module:
        cmd.append(f"--module={module}")
    env = dict(os.environ, FERRITE_LLM_PIPELINE=pipeline) if pipeline is not None else None
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    return [int(s) for s in r.stdout.split()]


@pytest.fixture(scope="module")
def cpu_ids(gguf_path):
    return {name: cli_ids(gguf_path, ids, "local-sync") for name, ids in PROMPTS.items()}


@pytest.mark.parametrize("prompt", sorted(PROMPTS))
def test_cli_on_cuda_equals_local_sync(gguf_path, cuda_vmfb, cpu_ids, prompt):
    assert cli_ids(gguf_path, PROMPTS[prompt], "cuda", cuda_vmfb) == cpu_ids[prompt]


def test_python_on_cuda_equals_local_sync(gguf_path, cuda_vmfb, cpu_ids):
    import ferrite.llm

    m = ferrite.llm.load(gguf_path, device="cuda", program=cuda_vmfb)
    for name, ids in PROMPTS.items():
        assert m.generate(ids, max_tokens=N, ignore_eos=True) == cpu_ids[name], name
    assert "".join(m.stream(PROMPTS["text"], max_tokens=N, ignore_eos=True)) == m.decode(cpu_ids["text"])


def test_upstream_on_cuda_equals_local_sync(gguf_path, cuda_vmfb, cpu_ids):
    import upstream_loop

    m = upstream_loop.UpstreamModel(gguf_path, "cuda", vmfb=cuda_vmfb)
    for name, ids in PROMPTS.items():
        got, _, _, _ = m.greedy(ids, N)
        assert got == cpu_ids[name], name


def test_device_greedy_equals_host_sampling_on_cuda(gguf_path, cuda_vmfb):
    """The cuda program's decode_greedy, run by ferrite_llm::pipeline with 1
    (the default) and 3 steps queued ahead of the one read, chooses the ids
    that sampling the logits on the host does (FERRITE_LLM_PIPELINE=0),
    over 96 tokens; upstream iree.runtime's loop of the same shape too."""
    import upstream_loop

    prompt, n = PROMPTS["text"], 96
    host = cli_ids(gguf_path, prompt, "cuda", cuda_vmfb, n=n, pipeline="0")
    for depth in ("1", "3"):
        assert cli_ids(gguf_path, prompt, "cuda", cuda_vmfb, n=n, pipeline=depth) == host, depth
    m = upstream_loop.UpstreamModel(gguf_path, "cuda", vmfb=cuda_vmfb)
    got, _, _ = m.greedy_device(prompt, n)
    assert got == host
