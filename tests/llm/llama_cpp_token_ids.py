"""Writes (or checks) tests/llm/llama_cpp_token_ids.json: the token ids
llama.cpp's tokenizer (`llama-cpp-python`, the model opened vocab-only)
gives for varied strings on the SmolLM2 `.gguf`, special tokens in the text
matched, no BOS added (as `ferrite_llm::Llm::encode`).
tests/llm/test_tokenizer.py compares Ferrite's ids with the file in CI
without building llama.cpp there (about 15 minutes from its sdist on 2 cores).

    .venv/bin/pip install llama-cpp-python
    .venv/bin/python tests/llm/llama_cpp_token_ids.py            # rewrite the fixture
    .venv/bin/python tests/llm/llama_cpp_token_ids.py --check    # llama.cpp still agrees with it
"""

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "examples" / "llm"))

import assets  # noqa: E402

FIXTURE = HERE / "llama_cpp_token_ids.json"

# Varied text: unicode (accents, CJK, emoji, combining marks, RTL),
# whitespace runs, digits, code, chat markup and contractions.
TEXTS = [
    "",
    "Hello, world!",
    "The capital of France is Paris.",
    " leading space",
    "trailing spaces   ",
    "two  spaces,   three,    four",
    "tabs\tand\t\ttabs",
    "line one\nline two\n\nline four\n\n\n",
    "windows\r\nline\r\nends",
    "   \n\t  \n ",
    "I'm sure you'll see they've done what we'd said; it's John's.",
    "DON'T SHOUT, I'LL HEAR",
    "1234567890 and 3.14159 and 1,000,000 and -42",
    "Call 555-0199 on 2024-01-31 at 23:59:59.",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe",
    "e\u0301 combining a\u030a",
    "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3068\u4e2d\u6587\u53e5\u5b50",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
    "emoji \U0001f600\U0001f680 \U0001f468\u200d\U0001f469\u200d\U0001f467 flags \U0001f1eb\U0001f1f7",
    "def add(a, b):\n    return a + b\n",
    "fn main() {\n\tlet x: Vec<u8> = vec![1, 2, 3];\n}",
    '{"key": [1, 2.5, null], "nested": {"a": "b"}}',
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "https://example.com/path?query=1&b=two#frag",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n",
    "text<|endoftext|>more text",
    "<|im_start partial markup |> and <im_end>",
    "!!!??? ... --- *** ### $$$ %%%",
    "MixedCASE camelCase snake_case kebab-case SCREAMING_CASE",
]


def llama_ids(texts):
    try:
        from llama_cpp import Llama
    except ImportError:
        sys.exit("llama_cpp_token_ids: llama-cpp-python is not installed (.venv/bin/pip install llama-cpp-python)")
    llm = Llama(model_path=str(assets.ensure(quiet=True)), vocab_only=True, verbose=False)
    return [llm.tokenize(t.encode("utf-8"), add_bos=False, special=True) for t in texts]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare llama.cpp with the fixture, write nothing")
    args = ap.parse_args()
    import llama_cpp

    ids = llama_ids(TEXTS)
    doc = {
        "generator": f"llama-cpp-python {llama_cpp.__version__} (Llama.tokenize, add_bos=False, special=True)",
        "gguf": assets.NAME,
        "cases": [{"text": t, "ids": i} for t, i in zip(TEXTS, ids)],
    }
    if args.check:
        old = json.loads(FIXTURE.read_text())
        want = {c["text"]: c["ids"] for c in old["cases"]}
        bad = [t for t, i in zip(TEXTS, ids) if want.get(t) != i]
        if bad:
            sys.exit(f"llama_cpp_token_ids: llama.cpp differs from the fixture on {len(bad)} texts: {bad!r}")
        print(f"llama_cpp_token_ids: llama.cpp agrees with the fixture on {len(TEXTS)} texts")
        return
    # One case per line: small diffs when llama.cpp or the texts change.
    cases = ",\n  ".join(json.dumps(c, ensure_ascii=True) for c in doc["cases"])
    head = {k: v for k, v in doc.items() if k != "cases"}
    FIXTURE.write_text(json.dumps(head, ensure_ascii=True)[:-1] + ',\n "cases": [\n  ' + cases + "\n ]\n}\n")
    print(f"llama_cpp_token_ids: wrote {FIXTURE} ({len(TEXTS)} texts)")


if __name__ == "__main__":
    main()
