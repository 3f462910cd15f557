"""`ferrite.llm` (the Python binding of ferrite_llm::Llm) against the CLI
`ferrite generate` (the same Rust loop): greedy and seeded-sampling ids equal
for the same prompt; streamed pieces join to the whole text; chat messages;
closing a stream; the GIL released while the model runs; bad input raises.

    .venv/bin/pytest -q tests/llm/test_python_llm.py   (the installed `ferrite`
                                                        package; FERRITE_BIN as test_llm.py)
"""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "llm"))

import assets  # noqa: E402

import ferrite.llm  # noqa: E402

FERRITE = Path(os.environ.get("FERRITE_BIN", ROOT / "target" / "debug" / "ferrite"))
TEXT_IDS = [504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 8590, 314]
N = 16


@pytest.fixture(scope="module")
def gguf_path():
    return assets.ensure(quiet=True)


@pytest.fixture(scope="module")
def llm(gguf_path):
    return ferrite.llm.load(gguf_path, device="local-task")


def cli(*args):
    if not FERRITE.exists():
        pytest.fail(f"{FERRITE} is missing: cargo build -p ferrite-cli (or set FERRITE_BIN)")
    r = subprocess.run([str(FERRITE), "generate", *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"ferrite generate {args}: {r.stderr}"
    return r.stdout


def test_loaded_model_facts(llm, gguf_path):
    assert llm.context_length == 2048
    assert llm.eos_token_id == 2
    assert llm.vocab_size == 49152
    assert llm.gguf_path == str(gguf_path) and llm.device == "local-task"


@pytest.mark.parametrize("device", ["local-sync", "local-task"])
def test_greedy_ids_equal_the_cli(gguf_path, device):
    m = ferrite.llm.load(gguf_path, device=device)
    got = m.generate(TEXT_IDS, max_tokens=N, ignore_eos=True)
    out = cli(f"--gguf={gguf_path}", "--prompt_ids=" + ",".join(map(str, TEXT_IDS)), f"--max_tokens={N}",
              "--ignore_eos", "--output_ids", f"--device={device}")
    assert got == [int(s) for s in out.split()]
    assert len(got) == N


def test_text_prompt_and_sampling_equal_the_cli(llm, gguf_path):
    text = llm.generate("The capital of France is", max_tokens=12)
    assert isinstance(text, str)
    assert cli(f"--gguf={gguf_path}", "--prompt=The capital of France is", "--max_tokens=12") == text + "\n"
    opts = dict(max_tokens=12, temperature=0.8, top_k=40, top_p=0.9, seed=7)
    sampled = llm.generate(TEXT_IDS, ignore_eos=True, **opts)
    again = llm.generate(TEXT_IDS, ignore_eos=True, **opts)
    out = cli(f"--gguf={gguf_path}", "--prompt_ids=" + ",".join(map(str, TEXT_IDS)), "--ignore_eos", "--output_ids",
              *[f"--{k}={v}" for k, v in opts.items()])
    assert sampled == again == [int(s) for s in out.split()]
    assert sampled != llm.generate(TEXT_IDS, max_tokens=12, ignore_eos=True), "sampling gave the greedy ids"


def test_stream_pieces_join_to_the_text(llm):
    full = llm.generate("Once upon a time", max_tokens=24, details=True)
    s = llm.stream("Once upon a time", max_tokens=24)
    pieces = list(s)
    assert len(pieces) > 5 and all(pieces)
    assert "".join(pieces) == full.text == s.text
    assert s.ids == full.ids and s.completion.ids == full.ids
    assert s.completion.finish_reason == full.finish_reason


def test_stop_string_streamed_and_whole(llm):
    whole = llm.generate("Once upon a time", max_tokens=24, details=True)
    stop = whole.text.split()[3]
    cut = llm.generate("Once upon a time", max_tokens=24, stop=stop, details=True)
    assert cut.finish_reason == "stop" and stop not in cut.text
    assert whole.text.startswith(cut.text) and len(cut.text) < len(whole.text)
    assert "".join(llm.stream("Once upon a time", max_tokens=24, stop=[stop])) == cut.text


def test_chat_forms_agree(llm):
    answer = llm.chat("What is the capital of France?", max_tokens=24)
    assert answer == "The capital of France is Paris."
    assert llm.chat([{"role": "user", "content": "What is the capital of France?"}], max_tokens=24) == answer
    assert "".join(llm.chat([("user", "What is the capital of France?")], stream=True, max_tokens=24)) == answer
    ids = llm.chat_prompt("What is the capital of France?")
    # The template opens with SmolLM2's default system turn; special
    # tokens (<|im_start|> = 1, <|im_end|> = 2) are skipped in the text.
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2
    assert llm.decode(ids).endswith("user\nWhat is the capital of France?\nassistant\n")
    assert llm.encode("The capital of France is Paris.") == [504, 3575, 282, 4649, 314, 7042, 30]


def test_closing_a_stream_ends_it_and_frees_the_model(llm):
    s = llm.stream(TEXT_IDS, max_tokens=2000, ignore_eos=True)
    next(s)
    s.close()
    assert list(s) == []
    t = time.perf_counter()
    assert len(llm.generate(TEXT_IDS, max_tokens=2, ignore_eos=True)) == 2
    # The model's lock came back after the token in flight: the 2000
    # tokens asked for would hold it for a minute or more.
    assert time.perf_counter() - t < 20


def test_the_gil_is_released_while_generating(llm):
    done = threading.Event()

    def work():
        llm.generate(TEXT_IDS, max_tokens=16, ignore_eos=True)
        done.set()

    t = threading.Thread(target=work)
    t.start()
    ticks = 0
    while not done.is_set():
        time.sleep(0.001)
        ticks += 1
    t.join()
    # Holding the GIL for the whole generation (~0.5 s or more) would
    # leave this thread one or two ticks.
    assert ticks >= 20, ticks


# ------------------------------------------------------------ bad input


def test_missing_gguf(tmp_path):
    p = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        ferrite.llm.load(p)


def test_not_a_gguf(tmp_path):
    p = tmp_path / "junk.gguf"
    p.write_bytes(b"not a model at all")
    with pytest.raises(ValueError, match="GGUF"):
        ferrite.llm.load(p)


def test_prompt_past_the_context(llm):
    ids = [504] * (llm.context_length + 1)
    with pytest.raises(ValueError, match="2049 tokens.*2048"):
        llm.generate(ids, max_tokens=1)
    with pytest.raises(ValueError, match="2049 tokens.*2048"):
        llm.stream(ids, max_tokens=1)


def test_context_asked_for_at_load(gguf_path):
    """context=64: the capacity the program reports; 60 prompt tokens + 10
    new ones pass it, a ValueError naming it (generate and stream), while
    + 5 fit and equal the default context's ids; bad sizes are refused."""
    small = ferrite.llm.load(gguf_path, device="local-sync", context=64)
    assert small.context_length == 64
    prompt = (TEXT_IDS * 5)[:60]
    with pytest.raises(ValueError, match="context of 64 positions"):
        small.generate(prompt, max_tokens=10, ignore_eos=True)
    with pytest.raises(ValueError, match="context of 64 positions"):
        list(small.stream(prompt, max_tokens=10, ignore_eos=True))
    roomy = ferrite.llm.load(gguf_path, device="local-sync")
    assert roomy.context_length == 2048
    assert small.generate(prompt, max_tokens=5, ignore_eos=True) == roomy.generate(prompt, max_tokens=5, ignore_eos=True)
    with pytest.raises(ValueError, match=">= 1"):
        ferrite.llm.load(gguf_path, context=0)
    with pytest.raises(ValueError, match="1..=8192"):
        ferrite.llm.load(gguf_path, context=8193)
    with pytest.raises(TypeError):
        ferrite.llm.load(gguf_path, context=64.0)


def test_bad_prompts_and_options(llm):
    with pytest.raises(ValueError, match="empty"):
        llm.generate("")
    with pytest.raises(ValueError, match="49152"):
        llm.generate([504, 49152])
    with pytest.raises(ValueError, match=">= 0"):
        llm.generate([504, -1])
    with pytest.raises(TypeError):
        llm.generate([504, 1.5])
    with pytest.raises(ValueError, match="top_p"):
        llm.generate("hi", top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        llm.generate("hi", temperature=-1.0)
    with pytest.raises(ValueError, match="'content'"):
        llm.chat([{"role": "user"}])
    with pytest.raises(TypeError, match="message 1"):
        llm.chat([("user", "hi"), 3])


def test_cuda_needs_a_cuda_program(gguf_path):
    # Refused before any device is opened: no GPU needed to check it.
    with pytest.raises(ValueError, match="build_cuda.py"):
        ferrite.llm.load(gguf_path, device="cuda")
