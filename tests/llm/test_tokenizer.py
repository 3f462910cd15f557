"""Ferrite's tokenizer for the SmolLM2 `.gguf` (built from the file's own
`tokenizer.ggml.*` metadata by ferrite-llm) against llama.cpp's tokenizer
on the same file: the ids llama.cpp gives for 32 varied strings are the
fixture llama_cpp_token_ids.json (regenerate or check it with
llama_cpp_token_ids.py, which needs llama-cpp-python; CI does not build it).
"""

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "examples" / "llm"))

import assets  # noqa: E402

import ferrite.llm  # noqa: E402

FIXTURE = json.loads((HERE / "llama_cpp_token_ids.json").read_text())
CASES = FIXTURE["cases"]
SPECIAL = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


@pytest.fixture(scope="module")
def llm():
    assert FIXTURE["gguf"] == assets.NAME, "the fixture is for another model file"
    return ferrite.llm.load(assets.ensure(quiet=True), device="local-sync")


def test_fixture_is_varied():
    texts = [c["text"] for c in CASES]
    assert len(texts) >= 30 and len(set(texts)) == len(texts)
    assert any(any(ord(ch) > 0x3000 for ch in t) for t in texts)  # CJK, emoji
    assert any("\t" in t or "   " in t for t in texts)
    assert any(any(s in t for s in SPECIAL) for t in texts)


@pytest.mark.parametrize("case", CASES, ids=[f"{i:02d}" for i in range(len(CASES))])
def test_ids_equal_llama_cpp(llm, case):
    assert llm.encode(case["text"]) == case["ids"], repr(case["text"])


@pytest.mark.parametrize("case", [c for c in CASES if not any(s in c["text"] for s in SPECIAL)],
                         ids=lambda c: repr(c["text"][:20]))
def test_decoding_returns_the_text(llm, case):
    assert llm.decode(case["ids"]) == case["text"]
