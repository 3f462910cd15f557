"""The package's console commands: the command-line tools of the native module.

`ferrite` is the whole CLI (`ferrite run-module ...`); `ferrite-benchmark-module`
is its `benchmark-module` command under the name and flags of upstream's
`iree-benchmark-module`, which `ferrite.runtime.benchmark` drives.
"""

import sys


def _run(argv):
    from ._ferrite import cli_main

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
