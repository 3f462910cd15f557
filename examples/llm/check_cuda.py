"""Teacher-forced logits of the cuda program against the CPU program, step
by step, on any SmolLM2 `.gguf` (the real one or a synthetic file of its
layout): the same prompt and the same forced next ids for both, so every
position's logits are compared, not only the greedy ids (which random
weights make all alike).

    python examples/llm/check_cuda.py record --runtime=iree --device=local-task --vmfb=examples/llm/smollm2.vmfb --gguf=G --out=cpu.npy
    FERRITE_CUDA_ONESHOT_GRAPHS=1 python examples/llm/check_cuda.py record --runtime=ferrite --device=cuda --vmfb=V --gguf=G --out=f.npy
    python examples/llm/check_cuda.py compare cpu.npy f.npy [more.npy ...]

`record` runs a prompt of PROMPT ids at position 0 and then `--steps` decode
calls fed pseudo-random ids (a fixed seed) at positions PROMPT.., with the
KV cache sized `--context`; the defaults cross the cuda decode step's
attended-length rounding (model.ATTEND_ROUND) three times and end at the
capacity. `compare` prints, for each candidate, the largest absolute
logit difference relative to the reference's largest logit, and how many
steps' argmax differ; it exits 1 when the relative difference passes
`--tol`.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PROMPT = 5


def forced_ids(steps, vocab=49152):
    return np.random.default_rng(27).integers(0, vocab, PROMPT + steps).tolist()


def record(a):
    if a.runtime == "ferrite":
        import ferrite.runtime as rt
    else:
        import iree.runtime as rt
    import upstream_loop

    m = upstream_loop.UpstreamModel(a.gguf, a.device, vmfb=a.vmfb, context=a.context, runtime=rt)
    if a.steps + PROMPT > m.context:
        raise SystemExit(f"check_cuda: {PROMPT} + {a.steps} positions pass the context {m.context}")
    ids = forced_ids(a.steps)
    out = [m.prefill(ids[:PROMPT])]
    for i in range(a.steps):
        out.append(m.decode(ids[PROMPT + i], PROMPT + i))
    np.save(a.out, np.stack(out).astype(np.float32))
    print(f"check_cuda: {a.runtime} {a.device}: {len(out)} logit rows -> {a.out}")


def compare(a):
    ref = np.load(a.reference).astype(np.float64)
    scale = np.abs(ref).max()
    worst = 0.0
    for path in a.candidates:
        got = np.load(path).astype(np.float64)
        if got.shape != ref.shape:
            raise SystemExit(f"check_cuda: {path} has shape {got.shape}, the reference {ref.shape}")
        rel = np.abs(got - ref).max(axis=1) / scale
        argmax = int((got.argmax(axis=1) != ref.argmax(axis=1)).sum())
        worst = max(worst, float(rel.max()))
        print(
            f"{path}: largest relative logit difference {rel.max():.2e} (step {int(rel.argmax())} of {len(rel)}), "
            f"argmax differs at {argmax} steps"
        )
    if worst > a.tol:
        print(f"check_cuda: FAILED: {worst:.2e} > tolerance {a.tol:.0e}")
        sys.exit(1)
    print(f"check_cuda: every candidate within {a.tol:.0e} of the reference")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--runtime", choices=["iree", "ferrite"], default="iree")
    r.add_argument("--device", default="local-task")
    r.add_argument("--vmfb", type=Path, required=True)
    r.add_argument("--gguf", type=Path, required=True)
    r.add_argument("--context", type=int, default=200)
    r.add_argument("--steps", type=int, default=195)
    r.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare")
    c.add_argument("reference", type=Path)
    c.add_argument("candidates", type=Path, nargs="+")
    c.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    record(a) if a.cmd == "record" else compare(a)


if __name__ == "__main__":
    main()
