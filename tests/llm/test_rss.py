"""Issue 27's memory target: peak RSS of `ferrite generate` at most the
`.gguf`'s size + the KV cache + 60 MB, with the bench's 128-token prompt
(scripts/bench-llm.py), on local-sync and on local-task with 2 workers.

    .venv/bin/pytest -q tests/llm/test_rss.py   (FERRITE_BIN as test_llm.py; the
                                                 installed `ferrite` package for ferrite.llm)

Peak RSS is what scripts/bench-llm.py reports: wait4's ru_maxrss of a fresh
process, started by a small process of its own (see `peak_rss`). The peak comes once the prefill has touched every weight page and
the cache is allocated; 16 generated tokens reach it (the resident set is
flat over the decode steps after the first few), which keeps the test short.
The 60 MB (decimal, as the issue writes it and README's 241 MiB for a
2048-position cache counts it) is the runtime's own share: binary text, the
tokenizer, heaps, thread stacks and the program's transients.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "llm"))

import assets  # noqa: E402
import model  # noqa: E402

FERRITE = Path(os.environ.get("FERRITE_BIN", ROOT / "target" / "debug" / "ferrite"))
MIB = 1 << 20
CONTEXT = 2048
# SmolLM2-135M's cache: 30 layers x (K, V) x 3 KV heads x 64 x f32 a
# position, 90 MiB for 2048 (the CLI's default context, asked for here).
KV_CACHE_BYTES = model.kv_bytes(CONTEXT)
OWN_SHARE = 60_000_000
# scripts/bench-llm.py's prompt: ordinary vocabulary ids cycled to 128.
BASE = [504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 8590, 314]
PROMPT = [BASE[i % len(BASE)] for i in range(128)]


# Linux keeps a process's resident high-water mark across exec: a process
# forked from this pytest process (gigabytes after the other tests in CI) and
# then exec'ed reports at least pytest's size in ru_maxrss. So a fresh,
# small interpreter forks the measured program and reports its wait4 usage.
SPAWN = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def peak_rss(cmd):
    """Runs `cmd`; returns (returncode, stdout, stderr, peak RSS in bytes)."""
    with tempfile.TemporaryDirectory() as d:
        report = Path(d) / "maxrss"
        r = subprocess.run([sys.executable, "-c", SPAWN, str(report), *cmd],
                           capture_output=True, timeout=600)
        kib = int(report.read_text()) if report.exists() else -1
    return r.returncode, r.stdout, r.stderr, kib * 1024


def check(peak, what, device, gguf):
    bound = Path(gguf).stat().st_size + KV_CACHE_BYTES + OWN_SHARE
    assert peak <= bound, (
        f"peak RSS {peak / MIB:.1f} MiB of {what} on {device} passes the bound {bound / MIB:.1f} MiB "
        f"(gguf {Path(gguf).stat().st_size / MIB:.1f} + KV cache {KV_CACHE_BYTES / MIB:.1f} + 60 MB = 57.2 MiB)")


@pytest.mark.parametrize("device", ["local-sync", "local-task://?workers=2"])
def test_peak_rss_within_gguf_plus_cache_plus_60_mb(device):
    gguf = assets.ensure(quiet=True)
    if not FERRITE.exists():
        pytest.fail(f"{FERRITE} is missing: cargo build -p ferrite-cli (or set FERRITE_BIN)")
    cmd = [str(FERRITE), "generate", f"--gguf={gguf}", "--prompt_ids=" + ",".join(map(str, PROMPT)),
           "--max_tokens=16", "--ignore_eos", "--output_ids", f"--context={CONTEXT}", f"--device={device}"]
    rc, out, err, peak = peak_rss(cmd)
    assert rc == 0, err.decode()[-3000:]
    assert len(out.split()) == 16, out
    check(peak, "ferrite generate", device, gguf)


# ferrite.llm in a fresh interpreter: the same loop under Python, whose own
# resident memory (the interpreter, ~10 MiB) counts against the bound too,
# as it does for upstream iree.runtime's Python loop in scripts/bench-llm.py.
PY_RUN = """
import sys
import ferrite.llm
gguf, device, context, prompt = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
llm = ferrite.llm.load(gguf, device=device, context=context)
ids = llm.generate([int(i) for i in prompt.split(",")], max_tokens=16, ignore_eos=True)
print(len(ids))
"""


def test_python_peak_rss_within_gguf_plus_cache_plus_60_mb():
    gguf = assets.ensure(quiet=True)
    device = "local-task://?workers=2"
    rc, out, err, peak = peak_rss([sys.executable, "-c", PY_RUN, str(gguf), device, str(CONTEXT),
                                   ",".join(map(str, PROMPT))])
    assert rc == 0, err.decode()[-3000:]
    assert int(out.split()[-1]) == 16, out
    check(peak, "ferrite.llm", device, gguf)


def test_a_large_parent_does_not_count():
    """The measurement itself: a program started from a process of 1 GiB
    resident reports its own peak, not its parent's."""
    ballast = bytearray(1 << 30)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    rc, _, _, peak = peak_rss([sys.executable, "-c", "pass"])
    del ballast
    assert rc == 0
    assert 0 < peak < 200 * MIB, f"{peak / MIB:.1f} MiB"
