"""Issue 27's memory target: peak RSS of `ferrite generate` at most the
`.gguf`'s size + the KV cache + 60 MB, with the bench's 128-token prompt
(scripts/bench-llm.py), on local-sync and on local-task with 2 workers.

    .venv/bin/pytest -q tests/llm/test_rss.py   (FERRITE_BIN as test_llm.py; the
                                                 installed `ferrite` package for ferrite.llm)

Peak RSS is what scripts/bench-llm.py reports: wait4's ru_maxrss of a fresh
process. The peak comes once the prefill has touched every weight page and
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


@pytest.mark.parametrize("device", ["local-sync", "local-task://?workers=2"])
def test_peak_rss_within_gguf_plus_cache_plus_60_mb(device):
    gguf = assets.ensure(quiet=True)
    if not FERRITE.exists():
        pytest.fail(f"{FERRITE} is missing: cargo build -p ferrite-cli (or set FERRITE_BIN)")
    cmd = [str(FERRITE), "generate", f"--gguf={gguf}", "--prompt_ids=" + ",".join(map(str, PROMPT)),
           "--max_tokens=16", "--ignore_eos", "--output_ids", f"--context={CONTEXT}", f"--device={device}"]
    # Output to files, not pipes: the child is reaped by wait4 itself, which
    # returns its usage (Popen.wait/communicate would reap it without).
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        p = subprocess.Popen(cmd, stdout=out_f, stderr=err_f)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    assert p.returncode == 0, err.decode()[-3000:]
    assert len(out.split()) == 16, out
    peak = usage.ru_maxrss * 1024
    bound = Path(gguf).stat().st_size + KV_CACHE_BYTES + OWN_SHARE
    assert peak <= bound, (
        f"peak RSS {peak / MIB:.1f} MiB on {device} passes the bound {bound / MIB:.1f} MiB "
        f"(gguf {Path(gguf).stat().st_size / MIB:.1f} + KV cache {KV_CACHE_BYTES / MIB:.1f} + 60 MB = 57.2 MiB)")


# ferrite.llm in a fresh interpreter: the same loop under Python, whose own
# resident memory (the interpreter, ~10 MiB) counts against the bound too,
# as it does for upstream iree.runtime's Python loop in scripts/bench-llm.py.
PY_RUN = """
import resource, sys
import ferrite.llm
gguf, device, context, prompt = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
llm = ferrite.llm.load(gguf, device=device, context=context)
ids = llm.generate([int(i) for i in prompt.split(",")], max_tokens=16, ignore_eos=True)
print(len(ids), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_python_peak_rss_within_gguf_plus_cache_plus_60_mb():
    gguf = assets.ensure(quiet=True)
    device = "local-task://?workers=2"
    r = subprocess.run([sys.executable, "-c", PY_RUN, str(gguf), device, str(CONTEXT),
                        ",".join(map(str, PROMPT))], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    n, kib = map(int, r.stdout.split())
    assert n == 16, r.stdout
    peak = kib * 1024
    bound = Path(gguf).stat().st_size + KV_CACHE_BYTES + OWN_SHARE
    assert peak <= bound, (
        f"peak RSS {peak / MIB:.1f} MiB of ferrite.llm on {device} passes the bound {bound / MIB:.1f} MiB")
