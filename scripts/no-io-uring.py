#!/usr/bin/env python3
"""Runs a command with io_uring_setup failing ENOSYS (Linux x86-64).

Upstream's `iree-benchmark-module` (3.13) starts an io_uring proactor
thread, which hangs under valgrind (valgrind does not model io_uring).
Refused io_uring, the runtime falls back to its poll-based proactor and
runs under valgrind, so its instructions per call can be counted beside
ferrite's:

    scripts/no-io-uring.py valgrind --tool=cachegrind --cache-sim=no \\
        .venv/lib/python3.11/site-packages/iree/_runtime_libs/iree-benchmark-module \\
        --module=add.vmfb --function=add --input=4xf32=1,2,3,4 --input=4xf32=10 \\
        --device=local-sync --benchmark_min_time=2001x

The filter is a seccomp program installed in this process before exec
(children inherit it): syscall 425 (io_uring_setup) returns ENOSYS,
everything else is allowed.
"""
import ctypes
import errno
import os
import platform
import struct
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
SYS_IO_URING_SETUP = 425  # x86-64
# BPF opcodes: BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K.
LD_W_ABS, JEQ_K, RET_K = 0x20, 0x15, 0x06
NR_OFFSET = 0  # offsetof(struct seccomp_data, nr)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if platform.machine() != "x86_64":
        sys.exit("no-io-uring.py: only x86-64 syscall numbers are known")
    insns = [
        (LD_W_ABS, 0, 0, NR_OFFSET),
        (JEQ_K, 0, 1, SYS_IO_URING_SETUP),
        (RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS),
        (RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
    code = b"".join(struct.pack("HBBI", *i) for i in insns)
    buf = ctypes.create_string_buffer(code, len(code))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(len(insns), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        sys.exit(f"prctl(NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        sys.exit(f"prctl(SECCOMP): {os.strerror(ctypes.get_errno())}")
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
