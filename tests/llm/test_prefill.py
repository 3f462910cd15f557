"""The committed CPU program's prefill (examples/llm/model.py): prompts of at
most PREFILL_FUSED_MAX tokens run the fused kernels, longer ones multiply f32
copies of the matrices dequantized per call, their rows padded to a multiple
of 8. Checked on upstream `iree.runtime` with the committed vmfb: the same
prompt fed in pieces that take every path gives the logits of one whole
prefill and of one token at a time; and the program, compiled with
generate.py's flags, makes no f32 global of a weight.

    .venv/bin/pytest -q tests/llm/test_prefill.py
"""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1].parent
sys.path.insert(0, str(ROOT / "examples" / "llm"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import generate  # noqa: E402
import model  # noqa: E402
from test_llm import PROMPTS, gguf_path  # noqa: E402,F401

IREE_COMPILE = Path(sys.executable).parent / "iree-compile"
# f32 sums in other orders (padded rows, other kernels): differences seen
# are ~1e-4 on logits of O(10).
TOL = 2e-3


def _last_logits(m, pieces):
    """Feeds `pieces` (lists of ids) at consecutive positions: a list of one
    id goes through decode, longer ones through prefill; the last logits."""
    pos = 0
    out = None
    for ids in pieces:
        if len(ids) == 1 and pos > 0:
            out = m.decode(ids[0], pos).to_host()
        else:
            out = m.prefill(np.asarray(ids, dtype=np.int32), pos).to_host()
        pos += len(ids)
    return np.asarray(out, dtype=np.float64)


def test_prefill_paths_agree(gguf_path):  # noqa: F811
    import upstream_loop

    m = upstream_loop.UpstreamModel(gguf_path, "local-sync").m
    ids = PROMPTS["chat"] + PROMPTS["text"][:5]  # 21 tokens
    assert model.PREFILL_FUSED_MAX == 3, "the pieces below straddle this bound"
    whole = _last_logits(m, [ids])  # copies, 21 rows padded to 24
    splits = {
        "one token at a time": [[i] for i in ids],
        "3 fused, 1 decode, 9 and 8 by copies": [ids[:3], ids[3:4], ids[4:13], ids[13:]],
        "2 and 1 fused, 18 by copies": [ids[:2], ids[2:3], ids[3:]],
        "4 by copies, 3 fused, 14 by copies": [ids[:4], ids[4:7], ids[7:]],
    }
    for name, pieces in splits.items():
        assert sum(pieces, []) == ids
        got = _last_logits(m, pieces)
        err = np.abs(got - whole).max()
        assert err < TOL, f"{name}: logits differ from one whole prefill by {err}"
        assert int(got.argmax()) == int(whole.argmax()), name


def test_no_dequantized_weight_becomes_a_global(tmp_path):
    """generate.py's flags for the single program keep constant-expression
    hoisting off: with it on, the compiler makes a dequantized f32 copy of
    a weight a global computed at load (seen: `__hoisted_tensor_192x18x2x16xf32`)."""
    stem, build, flags = generate.PROGRAMS["single"]
    src = tmp_path / f"{stem}.mlir"
    src.write_text(build())
    out = tmp_path / "stream.mlir"
    subprocess.run(
        [str(IREE_COMPILE), *generate.CPU_FLAGS, *flags, "--compile-to=stream", str(src), "-o", str(out)],
        check=True,
    )
    globals_ = re.findall(r"util\.global private (?:mutable )?@(\S+)", out.read_text())
    assert globals_, "no globals found: the stream output changed form"
    # The weights, the caches (with the sizes and timepoints the compiler
    # keeps beside them) and the device.
    ours = re.compile(r"w_\w+|kv\d+(__\w+)?|__device_\d+")
    extra = [g for g in globals_ if not ours.fullmatch(g)]
    assert not extra, f"globals other than the weights, the caches and the device: {extra[:5]}"
