"""A forked child (a DataLoader worker) runs a program whose parameter is a
demand-paged copy made in the parent (issue 26: the copy was not inherited,
MADV_DONTFORK, and the child died of SIGSEGV on the weights)."""

import os
import struct
import subprocess

import numpy as np
import pytest

import ferrite.runtime as rt
from conftest import ROOT, _compiler

N = 40000  # tests/parameters/table_sum.mlir: 160 KB, several 64 KiB chunks


@pytest.fixture(scope="module")
def table_sum(tmp_path_factory):
    compiler = _compiler()
    if compiler is None:
        pytest.skip("iree-compile (pinned iree-base-compiler) not installed")
    out = tmp_path_factory.mktemp("fork") / "table_sum.vmfb"
    subprocess.run(
        [compiler, "--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
         "--iree-llvmcpu-target-cpu=generic", str(ROOT / "tests/parameters/table_sum.mlir"), "-o", str(out)],
        check=True)
    return out


def _misaligned_safetensors(path, t):
    header = b'{"t":{"dtype":"F32","shape":[%d],"data_offsets":[0,%d]}}' % (N, 4 * N)
    # The data starts 8 bytes past a multiple of 64: the parameter is bound
    # as an aligned copy, demand-paged where userfaultfd is available.
    header += b" " * ((-(8 + len(header)) % 64) + 8)
    assert (8 + len(header)) % 64 == 8
    path.write_bytes(struct.pack("<Q", len(header)) + header + t.tobytes())


def test_forked_child_reads_demand_paged_parameters(tmp_path, table_sum):
    t = (np.arange(N, dtype=np.float32) % 13) - 6
    x = np.full(N, 0.5, np.float32)
    want = float(np.dot(t.astype(np.float64), x))
    path = tmp_path / "t.safetensors"
    _misaligned_safetensors(path, t)
    index = rt.ParameterIndex()
    index.load(str(path))
    config = rt.Config("local-sync")
    params = rt.create_io_parameters_module(config.vm_instance, index.create_provider(scope="model"))
    program = rt.VmModule.mmap(config.vm_instance, str(table_sum))
    # Loading made the aligned copy; nothing of it was read yet.
    modules = rt.load_vm_modules(params, program, config=config)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            got = float(np.asarray(modules[-1].main(x)))
            code = 0 if got == want else 3
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert not os.WIFSIGNALED(status), f"the child died of signal {os.WTERMSIG(status)}"
    assert os.WEXITSTATUS(status) == 0, f"the child exited with {os.WEXITSTATUS(status)} (3: wrong sum, 2: error)"
    # The parent's copy still reads right.
    assert float(np.asarray(modules[-1].main(x))) == want
