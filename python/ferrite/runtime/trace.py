"""Execution traces (Ferrite's; upstream has no equivalent): a Chrome/Perfetto
JSON trace of invocations, VM function spans, dispatches by executable export
with workgroup counts (per worker thread on local-task), queue operations and
semaphore waits with what woke them, per thread and device. The same recorder
as the CLI's ``--trace=FILE.json`` and the Rust API's ``ferrite::trace``.

    import ferrite.runtime as rt
    with rt.tracing("trace.json"):
        f(x)

Open the file in https://ui.perfetto.dev or summarize it with
``ferrite profile trace.json``.
"""

import contextlib

from .._ferrite import start_trace, stop_trace, is_tracing

__all__ = ["start_trace", "stop_trace", "is_tracing", "tracing"]


@contextlib.contextmanager
def tracing(path):
    """Records a trace of the block and writes it to ``path`` (also when the
    block raises: a failing call's trace shows where it failed)."""
    start_trace()
    try:
        yield
    finally:
        stop_trace(str(path))
