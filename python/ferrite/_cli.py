"""The `ferrite` console command: the command-line tools of the native module."""

import sys


def main():
    from ._ferrite import cli_main

    # Output goes straight to the process's stdout/stderr from Rust; flush
    # anything Python buffered first so the two never interleave.
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(cli_main(["ferrite", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
