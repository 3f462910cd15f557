"""Semantic search with all-MiniLM-L6-v2 through Ferrite's Python API
(`ferrite.runtime`, a drop-in for `iree.runtime`).

Embeds the sentences of `corpus.txt` and a query with the committed program
(`minilm.vmfb`, weights read from the upstream `model.safetensors` as its
parameters), then prints the corpus sentences closest to the query (cosine
similarity of the normalised embeddings).

    .venv/bin/python examples/minilm/search.py ["a query"] [--device local-task|local-sync|cuda] [--top 5]

`--runtime iree` runs the same code on the pinned upstream `iree.runtime`.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import assets  # noqa: E402

SEQ = 128
DEFAULT_QUERY = "Someone is playing a musical instrument."


def module_for(device):
    """The committed program for a device: the CUDA build for `cuda*`."""
    return HERE / ("minilm_cuda.vmfb" if device.startswith("cuda") else "minilm.vmfb")


class Embedder:
    """Loads the program, its parameters and the tokenizer once; `embed`
    turns sentences into normalised 384-d embeddings.

    `rt` is the runtime package (`ferrite.runtime` or `iree.runtime`): the
    code below uses only their shared API.
    """

    def __init__(self, rt, device="local-task", module=None, weights=None, tokenizer=None):
        if weights is None or tokenizer is None:
            w, t = assets.ensure()
            weights, tokenizer = weights or w, tokenizer or t
        self.rt = rt
        self.config = rt.Config(device)
        index = rt.ParameterIndex()
        index.load(str(weights))
        params = rt.create_io_parameters_module(
            self.config.vm_instance, index.create_provider(scope="model")
        )
        hal = rt.create_hal_module(self.config.vm_instance, self.config.device)
        vm_module = rt.VmModule.mmap(self.config.vm_instance, str(module or module_for(device)))
        self.context = rt.SystemContext(vm_modules=[params, hal, vm_module], config=self.config)
        self.function = self.context.modules.module["embed"]
        self.tokenizer = rt.Tokenizer.from_file(str(tokenizer))
        self.cls = self.tokenizer.token_to_id("[CLS]")
        self.sep = self.tokenizer.token_to_id("[SEP]")

    def token_ids(self, text):
        """`[CLS] tokens [SEP]`, cut to SEQ tokens (keeping the `[SEP]`)."""
        ids = list(self.tokenizer.encode(text, add_special_tokens=True))
        if len(ids) > SEQ:
            ids = ids[: SEQ - 1] + [self.sep]
        return ids

    def inputs(self, text):
        """`(input_ids, attention_mask)`, both i64 `[1, SEQ]`: the real
        tokens padded with 0, the mask 1 over the real tokens."""
        ids = self.token_ids(text)
        input_ids = np.zeros((1, SEQ), np.int64)
        input_ids[0, : len(ids)] = ids
        mask = np.zeros((1, SEQ), np.int64)
        mask[0, : len(ids)] = 1
        return input_ids, mask

    def embed(self, texts):
        """Embeddings of `texts`, f32 `[len(texts), 384]`, one call each."""
        out = np.empty((len(texts), 384), np.float32)
        for i, text in enumerate(texts):
            result = self.function(*self.inputs(text))
            # Copied while `result` is alive: upstream's `to_host()` may be a
            # view of the result's mapped buffer, released with it.
            out[i] = result.to_host()[0]
        return out


def main():
    ap = argparse.ArgumentParser(description="Semantic search over examples/minilm/corpus.txt")
    ap.add_argument("query", nargs="?", default=DEFAULT_QUERY)
    ap.add_argument("--device", default="local-task", help="local-task, local-sync or cuda")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--corpus", type=Path, default=HERE / "corpus.txt")
    ap.add_argument("--runtime", choices=["ferrite", "iree"], default="ferrite")
    args = ap.parse_args()
    if args.runtime == "ferrite":
        import ferrite.runtime as rt
    else:
        import iree.runtime as rt

    corpus = [line.strip() for line in args.corpus.read_text().splitlines() if line.strip()]
    t0 = time.perf_counter()
    embedder = Embedder(rt, args.device)
    t1 = time.perf_counter()
    docs = embedder.embed(corpus)
    t2 = time.perf_counter()
    query = embedder.embed([args.query])[0]
    scores = docs @ query
    print(
        f"{args.runtime}.runtime on {args.device}: loaded in {(t1 - t0) * 1e3:.0f} ms, "
        f"embedded {len(corpus)} sentences in {(t2 - t1) * 1e3:.0f} ms "
        f"({(t2 - t1) * 1e3 / len(corpus):.1f} ms each)"
    )
    print(f"query: {args.query}")
    for rank, i in enumerate(np.argsort(-scores)[: args.top], 1):
        print(f"  {rank}. {scores[i]:.4f}  {corpus[i]}")


if __name__ == "__main__":
    main()
