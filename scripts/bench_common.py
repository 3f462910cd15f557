"""Helpers the Python benchmark scripts share."""
import collections
import json
import os
import signal
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compile_for_host(src_text, name):
    """Compiles MLIR `src_text` with the pinned iree-compile for this CPU into
    build/bench/<name>.vmfb (the source goes beside it) and returns the path."""
    out = os.path.join(ROOT, "build", "bench", name + ".vmfb")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    src = out.replace(".vmfb", ".mlir")
    with open(src, "w") as f:
        f.write(src_text)
    subprocess.run([os.path.join(ROOT, ".venv", "bin", "iree-compile"),
                    "--iree-hal-target-device=local",
                    "--iree-hal-local-target-device-backends=llvm-cpu",
                    "--iree-llvmcpu-target-cpu=host", src, "-o", out], check=True)
    return out


def byte_alphabet():
    """GPT-2's printable stand-in for each byte (the ByteLevel alphabet)."""
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def learn_bpe(text, merges=400):
    """A tiny BPE trainer: repeatedly merge the most frequent adjacent pair
    within space-led words (as GPT-2's pre-tokenizer splits them). Returns
    the tokenizer.json text of a byte-level BPE with those merges."""
    alpha = byte_alphabet()
    words = collections.Counter()
    for i, w in enumerate(text.split(" ")):
        w = (" " if i else "") + w
        words[tuple(alpha[b] for b in w.encode())] += 1
    vocab = {alpha[b]: b for b in range(256)}
    rules = []
    for _ in range(merges):
        pairs = collections.Counter()
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        (a, b), _ = pairs.most_common(1)[0]
        rules.append(f"{a} {b}")
        vocab.setdefault(a + b, len(vocab))
        merged = collections.Counter()
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": rules},
    })


def record(area, case, ferrite, upstream, unit, target=None, note="", loaded=None):
    """Adds one figure to the results file named by $FERRITE_BENCH_JSON (set
    by scripts/bench.py, which turns the collected figures into the README's
    table); does nothing when the variable is unset. `ferrite` and
    `upstream` are numbers in `unit` (lower is better); `target` is the
    ratio the project aims for, if any. `loaded`, a (ferrite, upstream)
    pair, is the same case timed on a busy machine (scripts/bench-load.py):
    the row then shows both, and `target` applies to the loaded ratio."""
    path = os.environ.get("FERRITE_BENCH_JSON")
    if not path:
        return
    row = {"area": area, "case": case, "ferrite": ferrite, "upstream": upstream, "unit": unit,
           "ratio": ferrite / upstream if upstream else None, "target": target, "note": note}
    if loaded is not None:
        lf, lu = loaded
        row.update(loaded_ferrite=lf, loaded_upstream=lu, loaded_ratio=lf / lu if lu else None)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


class CpuLoad:
    """One busy process per CPU (issue 25's load): each limited by
    timeout(1) to `seconds`, in a session of its own, its output discarded,
    killed on exit from the `with` block. Entering waits 3 s so the
    scheduler spreads the load first (as `ferrite benchmark-module
    --under-load` does)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __enter__(self):
        self.procs = [subprocess.Popen(["timeout", str(self.seconds), "sh", "-c", "while :; do :; done"],
                                       start_new_session=True, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
                      for _ in range(os.cpu_count())]
        time.sleep(3)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs:
            p.wait()
