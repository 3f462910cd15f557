#!/usr/bin/env python3
"""Tokenizer benchmark: Ferrite's `rt.Tokenizer` vs the pinned iree.runtime's, one run, interleaved.

The tokenizer is a GPT-2 style byte-level BPE trained here (no network):
`--merges` merges learned from the repository's own sources and docs. The
text encoded is those files concatenated (about 2 MB). Before timing, each
runtime must decode its ids back to the text, and Ferrite's ids must equal
HuggingFace's `tokenizers` (when that package is importable). Where the
pinned upstream's ids differ (its BPE applies some merges in another order
than HuggingFace's; see tests/python/test_tokenizer.py), the count of
differing tokens is reported. Reported per case: the median over rounds of the time per pass, the
throughput, and the ratio Ferrite/upstream (lower is better).

Cases:
  encode          one `encode` call over the whole text
  encode-lines    one `encode` call per line (call overhead dominates)
  decode          one `decode` call over all the ids
  stream-decode   `decode_stream().feed_one` per id (incremental detokenizing)

Usage: .venv/bin/python scripts/bench-tokenizer.py [--rounds N] [--merges N]
"""
import argparse
import glob
import json
import os
import statistics
import sys
import time

from bench_common import ROOT, learn_bpe


def log(msg):
    print(msg, flush=True)


def corpus():
    """The repository's Rust, Python and Markdown files, in a stable order."""
    paths = []
    for pattern in ("crates/**/*.rs", "python/**/*.py", "scripts/*.py", "*.md"):
        paths += glob.glob(os.path.join(ROOT, pattern), recursive=True)
    text = []
    for p in sorted(paths):
        with open(p, encoding="utf-8", errors="replace") as f:
            text.append(f.read())
    return "\n".join(text)


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--merges", type=int, default=1000)
    args = ap.parse_args()
    import ferrite.runtime as ferrite_rt
    try:
        import iree.runtime as upstream_rt
    except ImportError:
        sys.exit("iree.runtime (iree-base-runtime==3.13.0) is needed: run scripts/setup-venv.sh")

    text = corpus()
    log(f"corpus: {len(text) / 1e6:.2f} MB of repository text; training {args.merges} BPE merges...")
    t = time.perf_counter()
    spec = learn_bpe(text[:100_000], args.merges)
    log(f"  {len(json.loads(spec)['model']['vocab'])} tokens in {time.perf_counter() - t:.1f} s")
    toks = {"ferrite": ferrite_rt.Tokenizer.from_huggingface_json(spec),
            "upstream": upstream_rt.Tokenizer.from_huggingface_json(spec)}

    ids = {k: t.encode(text) for k, t in toks.items()}
    for k, t in toks.items():
        if t.decode(ids[k]) != text:
            sys.exit(f"{k}: decode(encode(text)) != text")
    try:
        import tokenizers
        reference = tokenizers.Tokenizer.from_str(spec).encode(text).ids
        if reference != ids["ferrite"]:
            sys.exit("ferrite's ids differ from HuggingFace tokenizers'")
        log(f"  ferrite's {len(ids['ferrite'])} ids equal HuggingFace tokenizers'")
    except ImportError:
        log("  (HuggingFace tokenizers not installed: reference check skipped)")
    if ids["ferrite"] == ids["upstream"]:
        log("  upstream's ids are the same")
    else:
        diff = sum(a != b for a, b in zip(ids["ferrite"], ids["upstream"]))
        log(f"  upstream gives {len(ids['upstream'])} ids, {diff} positions differ "
            f"(its merge order differs from HuggingFace's)")
    ids = ids["ferrite"]
    lines = text.split("\n")

    def stream_decode(t):
        s = t.decode_stream()
        for i in ids:
            s.feed_one(i)
        s.finalize()

    cases = [
        ("encode", lambda t: t.encode(text), len(text.encode()), "MB/s"),
        ("encode-lines", lambda t: [t.encode(line) for line in lines], len(lines), "calls/s"),
        ("decode", lambda t: t.decode(ids), len(ids), "tokens/s"),
        ("stream-decode", stream_decode, len(ids), "tokens/s"),
    ]
    summary = []
    for name, fn, units, unit_name in cases:
        per = {"ferrite": [], "upstream": []}
        for r in range(args.rounds):
            order = ("ferrite", "upstream") if r % 2 == 0 else ("upstream", "ferrite")
            for label in order:
                per[label].append(timed(lambda: fn(toks[label])))
            log(f"  {name} round {r + 1}/{args.rounds}: ferrite {per['ferrite'][-1] * 1e3:.1f} ms, "
                f"upstream {per['upstream'][-1] * 1e3:.1f} ms")
        f, u = statistics.median(per["ferrite"]), statistics.median(per["upstream"])
        scale = 1e6 if unit_name == "MB/s" else 1
        line = (f"{name}: ferrite {f * 1e3:.1f} ms ({units / f / scale:,.1f} {unit_name}), "
                f"upstream {u * 1e3:.1f} ms ({units / u / scale:,.1f} {unit_name}), ratio: {f / u:.2f}")
        log(line)
        summary.append(line)
    log("\nsummary (ratio = ferrite / upstream time, lower is better):")
    for s in summary:
        log("  " + s)


if __name__ == "__main__":
    main()
