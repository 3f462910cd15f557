"""`python -m ferrite.serve`: the OpenAI-compatible server, the same as the
`ferrite serve` command (crates/ferrite-serve), run in-process by the native
extension with this module's arguments passed through:

    python -m ferrite.serve --gguf=SmolLM2-135M-Instruct.Q4_1.gguf --port=8000

See `python -m ferrite.serve --help` for every flag. SIGTERM or Ctrl-C stop
it cleanly (running streams finish or are cancelled).
"""

import sys

from ._cli import _run


def main(argv=None):
    """Runs the server with `argv` (default: this process' arguments) and
    exits with its status."""
    args = sys.argv[1:] if argv is None else list(argv)
    _run(["ferrite", "serve", *args])


if __name__ == "__main__":
    main()
