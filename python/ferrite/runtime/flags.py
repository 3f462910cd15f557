"""Process-wide runtime flags, as `iree-run-module` takes them.

`parse_flags("--task_topology_group_count=4")` sets flags for the whole
process; devices created afterwards follow them (the worker count of
`local-task`). Unknown flags and malformed values raise `ValueError`.

The `IREE_PY_RUNTIME_FLAGS` environment variable, when set, is split like a
shell command line and parsed when this module is imported.
"""

import os as _os
import shlex as _shlex

from .._ferrite import parse_flags

__all__ = ["parse_flags", "FUNCTION_INPUT_VALIDATION"]

# Whether function invokers check inputs against the function's declared
# signature before calling (clearer errors for a little time per call).
FUNCTION_INPUT_VALIDATION = True


def _load_default_flags_from_env():
    """Parses `IREE_PY_RUNTIME_FLAGS` (run at import; callable again)."""
    text = _os.getenv("IREE_PY_RUNTIME_FLAGS")
    if not text:
        return
    try:
        parse_flags(*_shlex.split(text))
    except ValueError as e:
        raise RuntimeError(
            f"Bad flag value in environment variable IREE_PY_RUNTIME_FLAGS='{text}': {e}"
        ) from e


_load_default_flags_from_env()
