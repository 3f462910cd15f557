"""The package's console commands: the command-line tools of the native module.

`ferrite` is the whole CLI, the same commands as the `ferrite` executable of
crates/ferrite-cli (`ferrite run-module ...`, `ferrite e2e-matmul-test ...`,
`ferrite generate ...`); `ferrite-benchmark-module`
is its `benchmark-module` command under the name and flags of upstream's
`iree-benchmark-module`, which `ferrite.runtime.benchmark` drives.
"""

import os
import sys
import sysconfig


def _script_dirs():
    """The directories where this Python environment's console scripts live
    (pip puts `iree-benchmark-module` of `iree-base-runtime` there, beside
    `ferrite`): the scheme's scripts path and the interpreter's own
    directory (a venv's `bin`, as `sys.executable` is not resolved)."""
    dirs = []
    for d in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        if d and d not in dirs:
            dirs.append(d)
    return os.pathsep.join(dirs)


def _run(argv):
    from ._ferrite import cli_main

    # This process's executable is the interpreter, so the CLI cannot find
    # the environment's tools beside itself (benchmark-module
    # --compare-upstream looks here, then in .venv/bin and on PATH).
    os.environ.setdefault("FERRITE_PYTHON_SCRIPTS", _script_dirs())

    # Output goes straight to the process's stdout/stderr from Rust; flush
    # anything Python buffered first so the two never interleave.
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(cli_main(argv))


def main():
    _run(["ferrite", *sys.argv[1:]])


def benchmark_module_main():
    _run(["ferrite", "benchmark-module", *sys.argv[1:]])


if __name__ == "__main__":
    main()
