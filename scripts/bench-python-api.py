#!/usr/bin/env python3
"""Tokenizer and Python-module costs: ferrite.runtime vs iree.runtime, one run,
interleaved (the two runtimes alternate every round).

Measures, on a byte-level BPE tokenizer.json written here (GPT-2's byte
alphabet plus a few hundred merges learned from the text below):
  - encode: `Tokenizer.encode` of ~40 KB of text (MB/s),
  - stream: the same text fed to an encode stream in 64-byte chunks (MB/s),
  - decode: `decode_stream().feed_one` over the ids (tokens/s);
and a PyModuleInterface round trip: a bytecode function calling a Python
`add_one` export (µs per call). Prints medians and ferrite / upstream ratios
(for rates, higher is better; for times, lower is better).

Usage: .venv/bin/python scripts/bench-python-api.py [--rounds N]
"""
import argparse
import collections
import os
import statistics
import subprocess
import time

from bench_common import ROOT, learn_bpe
TEXT = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs! "
    "How vexingly quick daft zebras jump; 12345 numbers, don't stop, we'll see. "
) * 250
PROGRAM = """func.func private @pymod.add_one(i32) -> i32
func.func @call(%a: i32) -> i32 {
  %0 = call @pymod.add_one(%a) : (i32) -> i32
  return %0 : i32
}
"""


def timed(fn, repeat):
    fn()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat


def tokenizer_figures(rt, spec):
    tok = rt.Tokenizer.from_huggingface_json(spec)
    ids = tok.encode(TEXT)
    mb = len(TEXT.encode()) / 1e6

    def stream():
        s = tok.encode_stream()
        out = []
        for i in range(0, len(TEXT), 64):
            out += s.feed(TEXT[i : i + 64])
        out += s.finalize()
        assert out == ids

    def decode():
        d = tok.decode_stream()
        parts = [d.feed_one(i) for i in ids]
        parts.append(d.finalize())
        assert "".join(parts) == TEXT

    return {
        "encode MB/s": mb / timed(lambda: tok.encode(TEXT), 5),
        "stream MB/s": mb / timed(stream, 2),
        "decode tokens/s": len(ids) / timed(decode, 2),
    }, ids


def pymodule_figure(rt, vmfb, calls=20000):
    class State:
        def __init__(self, iface):
            pass

        def add_one(self, a):
            return a + 1

    iface = rt.PyModuleInterface("pymod", State)
    iface.export("add_one", "0i_i", State.add_one)
    instance = rt.VmInstance()
    program = rt.VmModule.mmap(instance, vmfb)
    ctx = rt.VmContext(instance, modules=(iface.create(), program))
    f = program.lookup_function("call")
    args = rt.VmVariantList(1)
    args.push_int(41)

    def run():
        for _ in range(calls):
            out = rt.VmVariantList(1)
            ctx.invoke(f, args, out)
        assert out.get_variant(0) == 42

    return {"pymodule call us": timed(run, 1) / calls * 1e6}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    import ferrite.runtime as fe
    import iree.runtime as up

    out_dir = os.path.join(ROOT, "build", "bench")
    os.makedirs(out_dir, exist_ok=True)
    src, vmfb = os.path.join(out_dir, "pymod_call.mlir"), os.path.join(out_dir, "pymod_call.vmfb")
    with open(src, "w") as f:
        f.write(PROGRAM)
    subprocess.run([os.path.join(ROOT, ".venv", "bin", "iree-compile"), "--iree-hal-target-device=local",
                    "--iree-hal-local-target-device-backends=llvm-cpu", src, "-o", vmfb], check=True)
    spec = learn_bpe(TEXT)
    samples = {"ferrite": collections.defaultdict(list), "upstream": collections.defaultdict(list)}
    reference_ids = None
    for _ in range(args.rounds):
        for name, rt in (("upstream", up), ("ferrite", fe)):
            figures, ids = tokenizer_figures(rt, spec)
            if reference_ids is None:
                reference_ids = ids
            assert ids == reference_ids, f"{name} encodes differently"
            figures.update(pymodule_figure(rt, vmfb))
            for k, v in figures.items():
                samples[name][k].append(v)
    print(f"text {len(TEXT)} bytes, {len(reference_ids)} tokens; median of {args.rounds} interleaved rounds")
    print(f"{'figure':<20}{'ferrite':>14}{'upstream':>14}{'ratio':>10}")
    for k in samples["ferrite"]:
        a = statistics.median(samples["ferrite"][k])
        b = statistics.median(samples["upstream"][k])
        print(f"{k:<20}{a:>14.3f}{b:>14.3f}{a / b:>10.3f}")


if __name__ == "__main__":
    main()
