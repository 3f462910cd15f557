"""SmolLM2-135M (llama architecture) in float64 numpy over the dequantized
GGUF: the reference the compiled program is tested against.

The weights are the `.gguf`'s own tensors, dequantized by the PyPI `gguf`
package (`gguf.quants.dequantize`: Q4_1 and Q8_0 blocks to float32, which
this module widens to float64 one matrix at a time). The computation:

    x = token_embd[ids]
    per block:  h = rmsnorm(x) * attn_norm
                q, k, v = h @ Wq.T, h @ Wk.T, h @ Wv.T
                q, k = rope(q), rope(k)         # adjacent pairs (2i, 2i+1),
                                                # angle = pos * base^(-2i/64)
                a = causal softmax(q k^T / 8) v # head h reads KV head h // 3
                x = x + a @ Wo.T
                h = rmsnorm(x) * ffn_norm
                x = x + (silu(h @ Wg.T) * (h @ Wu.T)) @ Wd.T
    logits = rmsnorm(x) * output_norm @ token_embd.T   # tied output

The GGUF stores q/k rows in the order llama.cpp's "normal" RoPE expects
(pairs of adjacent dimensions), which is what `rope` below applies.
"""

import numpy as np


class Config:
    def __init__(self, fields):
        def get(key):
            return fields[key].contents()

        self.layers = int(get("llama.block_count"))
        self.dim = int(get("llama.embedding_length"))
        self.ffn = int(get("llama.feed_forward_length"))
        self.heads = int(get("llama.attention.head_count"))
        self.kv_heads = int(get("llama.attention.head_count_kv"))
        self.head_dim = self.dim // self.heads
        self.eps = float(get("llama.attention.layer_norm_rms_epsilon"))
        self.rope_base = float(get("llama.rope.freq_base"))
        self.vocab = int(get("llama.vocab_size"))


class Reference:
    """The model with a KV cache, one sequence. `forward(ids)` appends the
    tokens and returns the float64 logits of every one of them."""

    def __init__(self, gguf_path):
        import gguf

        reader = gguf.GGUFReader(str(gguf_path))
        self.cfg = Config(reader.fields)
        self.w = {}
        for t in reader.tensors:
            # float32 storage (dequantized values are float32 products of the
            # f16 scales); widened to float64 at use.
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            self.w[t.name] = np.asarray(a, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
        self.reset()

    def reset(self):
        c = self.cfg
        self.k = [np.zeros((0, c.kv_heads, c.head_dim)) for _ in range(c.layers)]
        self.v = [np.zeros((0, c.kv_heads, c.head_dim)) for _ in range(c.layers)]

    @property
    def pos(self):
        return self.k[0].shape[0]

    def W(self, name):
        return self.w[name].astype(np.float64)

    def rmsnorm(self, x, name):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.cfg.eps) * self.W(name)

    def rope(self, x, positions):
        # x: [T, H, D]; rotate pairs (2i, 2i+1) by positions * base^(-2i/D).
        d = x.shape[-1]
        inv = self.cfg.rope_base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        ang = positions[:, None] * inv[None, :]  # [T, D/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def forward(self, ids):
        c = self.cfg
        ids = np.asarray(ids, dtype=np.int64)
        t = ids.shape[0]
        start = self.pos
        positions = np.arange(start, start + t, dtype=np.float64)
        x = self.W("token_embd.weight")[ids]
        group = c.heads // c.kv_heads
        mask = np.arange(start + t)[None, :] > (start + np.arange(t))[:, None]
        for i in range(c.layers):
            p = f"blk.{i}."
            h = self.rmsnorm(x, p + "attn_norm.weight")
            q = (h @ self.W(p + "attn_q.weight").T).reshape(t, c.heads, c.head_dim)
            k = (h @ self.W(p + "attn_k.weight").T).reshape(t, c.kv_heads, c.head_dim)
            v = (h @ self.W(p + "attn_v.weight").T).reshape(t, c.kv_heads, c.head_dim)
            q, k = self.rope(q, positions), self.rope(k, positions)
            self.k[i] = np.concatenate([self.k[i], k])
            self.v[i] = np.concatenate([self.v[i], v])
            K = np.repeat(self.k[i], group, axis=1)  # [L, H, D]
            V = np.repeat(self.v[i], group, axis=1)
            s = np.einsum("thd,lhd->htl", q, K) / np.sqrt(c.head_dim)
            s = np.where(mask[None], -np.inf, s)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            a = np.einsum("htl,lhd->thd", s, V).reshape(t, c.dim)
            x = x + a @ self.W(p + "attn_output.weight").T
            h = self.rmsnorm(x, p + "ffn_norm.weight")
            g = h @ self.W(p + "ffn_gate.weight").T
            u = h @ self.W(p + "ffn_up.weight").T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ self.W(p + "ffn_down.weight").T
        x = self.rmsnorm(x, "output_norm.weight")
        return x @ self.W("token_embd.weight").T

    def greedy(self, prompt_ids, n):
        """Greedy ids after `prompt_ids` (from an empty cache), and the
        logits each was picked from."""
        self.reset()
        logits = self.forward(prompt_ids)[-1]
        ids, all_logits = [], []
        for _ in range(n):
            nxt = int(np.argmax(logits))
            ids.append(nxt)
            all_logits.append(logits)
            logits = self.forward([nxt])[-1]
        return ids, np.array(all_logits)


if __name__ == "__main__":
    import sys
    import time

    import assets

    ref = Reference(assets.ensure())
    # "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    # ids via the transformers-free route would need a tokenizer; take them on argv.
    ids = [int(s) for s in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 4093, 198]
    t0 = time.time()
    out, _ = ref.greedy(ids, 16)
    print(out, f"{time.time() - t0:.1f}s")
