"""all-MiniLM-L6-v2 (sentence-transformers) written here twice: as an ONNX graph
for the pinned IREE compiler, and as a float64 numpy reference.

Both read the tensors of the upstream `model.safetensors` by their own names,
so the compiled program takes that file unchanged as its parameters
(`--parameters=model=model.safetensors`).

The model: BERT (6 layers, hidden 384, 12 heads of 32, intermediate 1536,
exact-erf GELU, LayerNorm eps 1e-12), mean pooling over the attention mask,
then L2 normalisation. One sequence of `SEQ` tokens per call:
`embed(input_ids: i64[1, SEQ], attention_mask: i64[1, SEQ]) -> f32[1, 384]`.
"""

import json
import struct

import numpy as np

SEQ = 128
HIDDEN = 384
HEADS = 12
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 1536
LAYERS = 6
LN_EPS = 1e-12
# Added to the attention scores of padding positions (as BERT's extended
# attention mask in sentence-transformers' original checkpoint code).
MASK_BIAS = -10000.0

_DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    """The tensors of a `.safetensors` file by name (numpy arrays, read-only
    views of one mapping of the file)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = _DTYPES[info["dtype"]]
        out[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(info["shape"])
    return out


def weight_shapes():
    """Name -> shape of every tensor the program reads."""
    shapes = {
        "embeddings.word_embeddings.weight": (30522, HIDDEN),
        "embeddings.position_embeddings.weight": (512, HIDDEN),
        "embeddings.token_type_embeddings.weight": (2, HIDDEN),
    }
    dense = {
        "attention.self.query": (HIDDEN, HIDDEN),
        "attention.self.key": (HIDDEN, HIDDEN),
        "attention.self.value": (HIDDEN, HIDDEN),
        "attention.output.dense": (HIDDEN, HIDDEN),
        "intermediate.dense": (INTERMEDIATE, HIDDEN),
        "output.dense": (HIDDEN, INTERMEDIATE),
    }
    for name in weight_names():
        if name in shapes:
            continue
        stem, kind = name.rsplit(".", 1)
        part = stem.split(".", 3)[-1] if stem.startswith("encoder.") else stem
        if kind == "weight" and part in dense:
            shapes[name] = dense[part]
        elif part in dense:
            shapes[name] = (dense[part][0],)
        else:  # LayerNorm weight/bias
            shapes[name] = (HIDDEN,)
    return shapes


def write_random_safetensors(path, seed=0):
    """MiniLM-shaped random f32 weights (same names and shapes as the real
    file) as a .safetensors file whose tensors start 64-byte aligned; for
    benchmarks where the real weights cannot be had."""
    rng = np.random.default_rng(seed)
    header, offset, arrays = {}, 0, []
    for name, shape in weight_shapes().items():
        a = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if name.endswith("LayerNorm.weight"):
            a += 1.0
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + a.nbytes]}
        arrays.append(a)
        offset += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 64)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for a in arrays:
            f.write(a.tobytes())


def weight_names():
    """The safetensors tensors the program reads (in a fixed order)."""
    names = [
        "embeddings.word_embeddings.weight",
        "embeddings.position_embeddings.weight",
        "embeddings.token_type_embeddings.weight",
        "embeddings.LayerNorm.weight",
        "embeddings.LayerNorm.bias",
    ]
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        for part in (
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "attention.output.dense",
            "intermediate.dense",
            "output.dense",
        ):
            names += [p + part + ".weight", p + part + ".bias"]
        for part in ("attention.output.LayerNorm", "output.LayerNorm"):
            names += [p + part + ".weight", p + part + ".bias"]
    return names


# ---------------------------------------------------------------- reference


def _layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + LN_EPS) * g + b


def _erf(x):
    # float64 erf without scipy: math.erf elementwise (exact to double).
    import math

    return np.vectorize(math.erf, otypes=[np.float64])(x)


def reference_embed(weights, input_ids, attention_mask=None):
    """The model in float64 numpy for one sequence: `input_ids` (ints,
    shape [n]) and `attention_mask` (0/1, shape [n]; all ones by default);
    returns the normalised embedding, shape [384].

    Called with only the real tokens (no padding) this is sentence-
    transformers' own computation; the compiled program pads to SEQ and masks
    the padding out, which must give the same result (in float64 the masked
    scores' exponentials underflow to exactly 0)."""
    names = set(weight_names())
    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items() if k in names}
    ids = np.asarray(input_ids, dtype=np.int64)
    n = ids.shape[0]
    mask = np.ones(n) if attention_mask is None else np.asarray(attention_mask, dtype=np.float64)
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][:n]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    bias = (1.0 - mask) * MASK_BIAS

    def dense(h, name):
        return h @ w[name + ".weight"].T + w[name + ".bias"]

    def heads(h):
        return h.reshape(n, HEADS, HEAD_DIM).transpose(1, 0, 2)

    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        q = heads(dense(x, p + "attention.self.query"))
        k = heads(dense(x, p + "attention.self.key"))
        v = heads(dense(x, p + "attention.self.value"))
        s = q @ k.transpose(0, 2, 1) / np.sqrt(HEAD_DIM) + bias
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        c = (s @ v).transpose(1, 0, 2).reshape(n, HIDDEN)
        a = dense(c, p + "attention.output.dense")
        x = _layer_norm(
            a + x, w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"]
        )
        h = dense(x, p + "intermediate.dense")
        h = 0.5 * h * (1.0 + _erf(h / np.sqrt(2.0)))
        o = dense(h, p + "output.dense")
        x = _layer_norm(o + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
    pooled = (mask[:, None] * x).sum(0) / max(mask.sum(), 1e-9)
    return pooled / max(np.linalg.norm(pooled), 1e-12)


# ---------------------------------------------------------------- ONNX graph


def build_onnx(weights):
    """The model as an ONNX graph (opset 17) whose initializers are the
    safetensors tensors under their own names."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = []
    counter = [0]

    def fresh(prefix):
        counter[0] += 1
        return f"{prefix}_{counter[0]}"

    def const(values, dtype=np.int64):
        name = fresh("c")
        arr = np.asarray(values, dtype=dtype)
        nodes.append(
            helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr, name + "_v"))
        )
        return name

    def op(kind, inputs, **attrs):
        out = fresh(kind.lower())
        nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def dense(h, name):
        # h @ W^T + b with W [out, in] as stored by PyTorch.
        return op("Gemm", [h, name + ".weight", name + ".bias"], transB=1)

    def layer_norm(h, name):
        return op(
            "LayerNormalization", [h, name + ".weight", name + ".bias"], axis=-1, epsilon=LN_EPS
        )

    def heads(h, perm):
        return op("Transpose", [op("Reshape", [h, const([SEQ, HEADS, HEAD_DIM])])], perm=perm)

    ids = op("Reshape", ["input_ids", const([SEQ])])
    x = op("Gather", ["embeddings.word_embeddings.weight", ids], axis=0)
    positions = const(np.arange(SEQ))
    pos = op("Gather", ["embeddings.position_embeddings.weight", positions], axis=0)
    tok = op("Gather", ["embeddings.token_type_embeddings.weight", const(0)], axis=0)
    x = op("Add", [op("Add", [x, pos]), tok])
    x = layer_norm(x, "embeddings.LayerNorm")

    mask = op("Cast", ["attention_mask"], to=TensorProto.FLOAT)  # [1, SEQ]
    bias = op("Mul", [op("Sub", [const(1.0, np.float32), mask]), const(MASK_BIAS, np.float32)])
    bias = op("Reshape", [bias, const([1, 1, SEQ])])
    scale = const(1.0 / np.sqrt(HEAD_DIM), np.float32)
    inv_sqrt2 = const(1.0 / np.sqrt(2.0), np.float32)

    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        q = heads(dense(x, p + "attention.self.query"), [1, 0, 2])  # [H, S, D]
        k = heads(dense(x, p + "attention.self.key"), [1, 2, 0])  # [H, D, S]
        v = heads(dense(x, p + "attention.self.value"), [1, 0, 2])  # [H, S, D]
        s = op("Add", [op("Mul", [op("MatMul", [q, k]), scale]), bias])
        s = op("Softmax", [s], axis=-1)
        c = op("Transpose", [op("MatMul", [s, v])], perm=[1, 0, 2])
        c = op("Reshape", [c, const([SEQ, HIDDEN])])
        a = dense(c, p + "attention.output.dense")
        x = layer_norm(op("Add", [a, x]), p + "attention.output.LayerNorm")
        h = dense(x, p + "intermediate.dense")
        gelu = op("Add", [op("Erf", [op("Mul", [h, inv_sqrt2])]), const(1.0, np.float32)])
        h = op("Mul", [op("Mul", [h, gelu]), const(0.5, np.float32)])
        o = dense(h, p + "output.dense")
        x = layer_norm(op("Add", [o, x]), p + "output.LayerNorm")

    summed = op("MatMul", [mask, x])  # [1, HIDDEN]
    count = op("Max", [op("ReduceSum", [mask], keepdims=1), const([[1e-9]], np.float32)])
    pooled = op("Div", [summed, count])
    norm = op("Max", [op("ReduceL2", [pooled], axes=[-1], keepdims=1), const([[1e-12]], np.float32)])
    nodes.append(helper.make_node("Div", [pooled, norm], ["embedding"]))

    initializers = [
        numpy_helper.from_array(np.ascontiguousarray(weights[n], dtype=np.float32), n)
        for n in weight_names()
    ]
    graph = helper.make_graph(
        nodes,
        "embed",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, SEQ]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, SEQ]),
        ],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, HIDDEN])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=False)
    return model
