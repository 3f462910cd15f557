"""SmolLM2-135M-Instruct (llama architecture) as an MLIR program for the pinned
IREE compiler, written here as text (linalg on tensors), with its weights read
by name from the `.gguf` itself: every tensor is a `util.global` bound to
`#stream.parameter.named<"model"::"<gguf tensor name>">`, so the compiled
program takes the file unchanged (`--parameters=model=SmolLM2-...gguf`).

Weights stay in the file's own quantized layout, as byte tensors:

- Q4_1 matrix [N, K]: `tensor<N x K/32 x 20 x i8>`, per block of 32 values
  f16 d (bytes 0-1), f16 m (bytes 2-3), 16 bytes of nibbles: value j < 16 is
  the low nibble of byte 4+j, value 16+j its high nibble; w = d * q + m.
- Q8_0 matrix [N, K]: `tensor<N x K/32 x 34 x i8>`, f16 d then 32 i8; w = d * q.

and are dequantized inside the kernels (each matmul is one `linalg.generic`
reading the packed bytes), so the program holds 98 MB of weights, not 540 MB.

Entry points (the KV cache is program state: one mutable global `@kv<layer>`
per layer holding its K and V, `CONTEXT` positions each, updated in place):

    prefill(ids: tensor<?xi32>, pos: i32) -> tensor<VOCAB x f32>
        appends len(ids) tokens at positions pos.. and returns the logits of
        the last one;
    decode(id: i32, pos: i32) -> tensor<VOCAB x f32>
        the same for one token;
    context_length() -> i32
        CONTEXT, the KV cache's capacity.

A call whose positions would pass the capacity fails with a clear error
(`cf.assert`) instead of writing outside the cache. Attention reads only the
first pos + len positions of the cache (dynamic shapes), so a step costs what
its context costs, not the capacity's.
"""

import math

VOCAB = 49152
DIM = 576
FFN = 1536
LAYERS = 30
HEADS = 9
KV_HEADS = 3
HEAD_DIM = 64
GROUP = HEADS // KV_HEADS
EPS = 1e-5
ROPE_BASE = 100000.0
CONTEXT = 2048

# One layer's KV cache: [K or V, position, KV head, head dim].
KV_TYPE = f"tensor<2x{CONTEXT}x{KV_HEADS}x{HEAD_DIM}xf32>"

Q4_1 = ("Q4_1", 20)
Q8_0 = ("Q8_0", 34)


def weight_specs():
    """(gguf name, kind, shape) of every tensor the program reads: kind is
    'f32' (shape in elements) or a quantized format (shape [N, K] in values)."""
    specs = [("token_embd.weight", "Q8_0", (VOCAB, DIM)), ("output_norm.weight", "f32", (DIM,))]
    for i in range(LAYERS):
        p = f"blk.{i}."
        specs += [
            (p + "attn_norm.weight", "f32", (DIM,)),
            (p + "attn_q.weight", "Q4_1", (DIM, DIM)),
            (p + "attn_k.weight", "Q4_1", (KV_HEADS * HEAD_DIM, DIM)),
            (p + "attn_v.weight", "Q4_1", (KV_HEADS * HEAD_DIM, DIM)),
            (p + "attn_output.weight", "Q4_1", (DIM, DIM)),
            (p + "ffn_norm.weight", "f32", (DIM,)),
            (p + "ffn_gate.weight", "Q4_1", (FFN, DIM)),
            (p + "ffn_up.weight", "Q4_1", (FFN, DIM)),
            (p + "ffn_down.weight", "Q4_1", (DIM, FFN)),
        ]
    return specs


def _sym(name):
    return "w_" + name.replace(".", "_")


def _global_type(kind, shape):
    if kind == "f32":
        return f"tensor<{'x'.join(map(str, shape))}xf32>"
    n, k = shape
    block = 20 if kind == "Q4_1" else 34
    return f"tensor<{n}x{k // 32}x{block}xi8>"


def _map(dims, exprs):
    return f"affine_map<({', '.join(dims)}) -> ({', '.join(exprs)})>"


class Fn:
    """Emits one function body. `t` is the token count: an int (static) or
    None (dynamic, the SSA index %T)."""

    def __init__(self, t):
        self.t = t
        self.lines = []
        self.n = 0

    def fresh(self, p="v"):
        self.n += 1
        return f"%{p}_{self.n}"

    def emit(self, s):
        self.lines.append("    " + s)

    # Shapes: entries are ints, "T" (tokens) or "L" (attended positions).
    def dim(self, d):
        if d == "T":
            return "?" if self.t is None else str(self.t)
        if d == "L":
            return "?"
        return str(d)

    def ty(self, shape, et="f32"):
        return "tensor<" + "".join(self.dim(d) + "x" for d in shape) + et + ">"

    def dyn(self, shape):
        out = []
        for d in shape:
            if d == "T" and self.t is None:
                out.append("%T")
            elif d == "L":
                out.append("%L")
        return out

    def const(self, value, ty):
        v = self.fresh("c")
        self.emit(f"{v} = arith.constant {value} : {ty}")
        return v

    def empty(self, shape, et="f32", fill=None):
        v = self.fresh("e")
        self.emit(f"{v} = tensor.empty({', '.join(self.dyn(shape))}) : {self.ty(shape, et)}")
        if fill is None:
            return v
        c = self.const(fill, et)
        f = self.fresh("f")
        self.emit(f"{f} = linalg.fill ins({c} : {et}) outs({v} : {self.ty(shape, et)}) -> {self.ty(shape, et)}")
        return f

    def generic(self, dims, iters, ins, out, body, out_et="f32"):
        """ins: [(value, type, exprs, block-arg element type)];
        out: (value, shape, exprs); body: callable(args) -> list of lines,
        its last yielding; args are the block argument names."""
        v = self.fresh("g")
        maps = [_map(dims, e) for (_, _, e, _) in ins] + [_map(dims, out[2])]
        out_ty = self.ty(out[1], out_et)
        args = [f"%a{i}" for i in range(len(ins))] + ["%acc"]
        ets = [et for (_, _, _, et) in ins] + [out_et]
        head = f"{v} = linalg.generic {{indexing_maps = [{', '.join(maps)}], iterator_types = [{', '.join(chr(34) + i + chr(34) for i in iters)}]}}"
        if ins:
            head += f" ins({', '.join(i[0] for i in ins)} : {', '.join(i[1] for i in ins)})"
        head += f" outs({out[0]} : {out_ty}) {{"
        self.emit(head)
        self.emit("^bb0(" + ", ".join(f"{a}: {et}" for a, et in zip(args, ets)) + "):")
        for line in body(args):
            self.emit("  " + line)
        self.emit(f"}} -> {out_ty}")
        return v

    # ------------------------------------------------------------ pieces

    def slice_bytes(self, w, wty, n, blocks, block, offset, size):
        """The bytes [offset, offset+size) of every block: tensor<n x blocks
        x size xi8> (rank-reduced to n x blocks when size is 1)."""
        v = self.fresh("s")
        if size == 1:
            rty = f"tensor<{n}x{blocks}xi8>"
        else:
            rty = f"tensor<{n}x{blocks}x{size}xi8>"
        self.emit(
            f"{v} = tensor.extract_slice {w}[0, 0, {offset}] [{n}, {blocks}, {size}] [1, 1, 1] : {wty} to {rty}"
        )
        return v, rty

    @staticmethod
    def f16_lines(lo, hi, out):
        """Lines computing f32 `out` from the little-endian f16 bytes lo, hi."""
        return [
            f"{out}_l = arith.extui {lo} : i8 to i16",
            f"{out}_h = arith.extui {hi} : i8 to i16",
            f"{out}_8 = arith.constant 8 : i16",
            f"{out}_s = arith.shli {out}_h, {out}_8 : i16",
            f"{out}_b = arith.ori {out}_l, {out}_s : i16",
            f"{out}_f = arith.bitcast {out}_b : i16 to f16",
            f"{out} = arith.extf {out}_f : f16 to f32",
        ]

    def matmul_q4_1(self, x, name, n, k):
        """x: [T, k] f32 times the Q4_1 matrix `name` [n, k] transposed: [T, n].

        One `linalg.generic` over (t, n, block, j < 16) with the block and j
        as reductions: each step reads one packed byte and both its nibbles
        (the low one is value j of the block, the high one value 16 + j), so
        the innermost dimension is 16 contiguous bytes with no index-dependent
        shift, which the pinned compiler vectorizes (16 lanes; the sums are
        reassociated with `--iree-llvmcpu-reassociate-fp-reductions`, see
        generate.py). The earlier form, a reduction over (block, nibble half,
        j) selecting the nibble by `linalg.index`, compiled to one scalar add
        chain per block: 1.4 ms for a 1536x576 matrix against 0.14 ms now
        (2 cores, x86-64-v3)."""
        b = k // 32
        wty = _global_type("Q4_1", (n, k))
        w = self.fresh("w")
        self.emit(f"{w} = util.global.load @{_sym(name)} : {wty}")
        xe = self.fresh("x")
        xety = self.ty(["T", b, 2, 16])
        self.emit(f"{xe} = tensor.expand_shape {x} [[0], [1, 2, 3]] output_shape [{self.tsize()}, {b}, 2, 16] : {self.ty(['T', k])} into {xety}")
        halves = []
        for h in range(2):
            v = self.fresh("x")
            self.emit(
                f"{v} = tensor.extract_slice {xe}[0, 0, {h}, 0] [{self.tsize()}, {b}, 1, 16] [1, 1, 1, 1] : {xety} to {self.ty(['T', b, 16])}"
            )
            halves.append(v)
        qs, qty = self.slice_bytes(w, wty, n, b, 20, 4, 16)
        parts = [self.slice_bytes(w, wty, n, b, 20, o, 1) for o in range(4)]
        out = self.empty(["T", n], fill="0.0")
        dims = ["t", "n", "b", "j"]

        def body(a):
            x0, x1, q, dl, dh, ml, mh, acc = a
            return [
                *self.f16_lines(dl, dh, "%d"),
                *self.f16_lines(ml, mh, "%m"),
                "%c15 = arith.constant 15 : i8",
                "%c4 = arith.constant 4 : i8",
                f"%lo = arith.andi {q}, %c15 : i8",
                f"%hi = arith.shrui {q}, %c4 : i8",
                "%lf = arith.uitofp %lo : i8 to f32",
                "%hf = arith.uitofp %hi : i8 to f32",
                "%w0 = arith.mulf %d, %lf : f32",
                "%w0m = arith.addf %w0, %m : f32",
                "%w1 = arith.mulf %d, %hf : f32",
                "%w1m = arith.addf %w1, %m : f32",
                f"%p0 = arith.mulf {x0}, %w0m : f32",
                f"%p1 = arith.mulf {x1}, %w1m : f32",
                "%p = arith.addf %p0, %p1 : f32",
                f"%r = arith.addf {acc}, %p : f32",
                "linalg.yield %r : f32",
            ]

        ins = [(hv, self.ty(["T", b, 16]), ["t", "b", "j"], "f32") for hv in halves]
        ins += [(qs, qty, ["n", "b", "j"], "i8")]
        ins += [(p, pty, ["n", "b"], "i8") for (p, pty) in parts]
        return self.generic(
            dims,
            ["parallel", "parallel", "reduction", "reduction"],
            ins,
            (out, ["T", n], ["t", "n"]),
            body,
        )

    def tsize(self):
        return "%T" if self.t is None else str(self.t)

    def rmsnorm(self, x, name, rows="T"):
        gty = f"tensor<{DIM}xf32>"
        g = self.fresh("n")
        self.emit(f"{g} = util.global.load @{_sym(name)} : {gty}")
        ss = self.generic(
            ["t", "d"],
            ["parallel", "reduction"],
            [(x, self.ty([rows, DIM]), ["t", "d"], "f32")],
            (self.empty([rows], fill="0.0"), [rows], ["t"]),
            lambda a: [f"%sq = arith.mulf {a[0]}, {a[0]} : f32", f"%r = arith.addf {a[1]}, %sq : f32", "linalg.yield %r : f32"],
        )
        return self.generic(
            ["t", "d"],
            ["parallel", "parallel"],
            [
                (x, self.ty([rows, DIM]), ["t", "d"], "f32"),
                (ss, self.ty([rows]), ["t"], "f32"),
                (g, gty, ["d"], "f32"),
            ],
            (self.empty([rows, DIM]), [rows, DIM], ["t", "d"]),
            lambda a: [
                f"%n = arith.constant {float(DIM):.9e} : f32",
                f"%eps = arith.constant {EPS:.9e} : f32",
                f"%mean = arith.divf {a[1]}, %n : f32",
                "%var = arith.addf %mean, %eps : f32",
                "%rs = math.rsqrt %var : f32",
                f"%y = arith.mulf {a[0]}, %rs : f32",
                f"%z = arith.mulf %y, {a[2]} : f32",
                "linalg.yield %z : f32",
            ],
        )

    def add(self, a, b, shape):
        return self.generic(
            [f"d{i}" for i in range(len(shape))],
            ["parallel"] * len(shape),
            [(a, self.ty(shape), [f"d{i}" for i in range(len(shape))], "f32"), (b, self.ty(shape), [f"d{i}" for i in range(len(shape))], "f32")],
            (self.empty(shape), shape, [f"d{i}" for i in range(len(shape))]),
            lambda a: [f"%s = arith.addf {a[0]}, {a[1]} : f32", "linalg.yield %s : f32"],
        )

    def rope(self, x, heads):
        """x: [T, heads*64] -> [T, heads, 64], pairs (2i, 2i+1) rotated by
        (pos + t) * base^(-2i/64)."""
        half = HEAD_DIM // 2
        xe = self.fresh("x")
        self.emit(
            f"{xe} = tensor.expand_shape {x} [[0], [1, 2, 3]] output_shape [{self.tsize()}, {heads}, {half}, 2] : {self.ty(['T', heads * HEAD_DIM])} into {self.ty(['T', heads, half, 2])}"
        )
        parts = []
        for c in range(2):
            v = self.fresh("s")
            self.emit(
                f"{v} = tensor.extract_slice {xe}[0, 0, 0, {c}] [{self.tsize()}, {heads}, {half}, 1] [1, 1, 1, 1] : {self.ty(['T', heads, half, 2])} to {self.ty(['T', heads, half])}"
            )
            parts.append(v)
        r = self.generic(
            ["t", "h", "i", "c"],
            ["parallel"] * 4,
            [(p, self.ty(["T", heads, half]), ["t", "h", "i"], "f32") for p in parts],
            (self.empty(["T", heads, half, 2]), ["T", heads, half, 2], ["t", "h", "i", "c"]),
            lambda a: [
                "%t = linalg.index 0 : index",
                "%i = linalg.index 2 : index",
                "%c = linalg.index 3 : index",
                "%tp = arith.addi %t, %pos : index",
                "%tpi = arith.index_cast %tp : index to i64",
                "%tf = arith.sitofp %tpi : i64 to f32",
                "%ii = arith.index_cast %i : index to i64",
                "%if = arith.sitofp %ii : i64 to f32",
                f"%k = arith.constant {-2.0 / HEAD_DIM * math.log(ROPE_BASE):.9e} : f32",
                "%e = arith.mulf %if, %k : f32",
                "%inv = math.exp %e : f32",
                "%ang = arith.mulf %tf, %inv : f32",
                "%cos = math.cos %ang : f32",
                "%sin = math.sin %ang : f32",
                f"%x0c = arith.mulf {a[0]}, %cos : f32",
                f"%x1s = arith.mulf {a[1]}, %sin : f32",
                "%r0 = arith.subf %x0c, %x1s : f32",
                f"%x0s = arith.mulf {a[0]}, %sin : f32",
                f"%x1c = arith.mulf {a[1]}, %cos : f32",
                "%r1 = arith.addf %x0s, %x1c : f32",
                "%zero = arith.constant 0 : index",
                "%is0 = arith.cmpi eq, %c, %zero : index",
                "%r = arith.select %is0, %r0, %r1 : f32",
                "linalg.yield %r : f32",
            ],
        )
        out = self.fresh("x")
        self.emit(
            f"{out} = tensor.collapse_shape {r} [[0], [1], [2, 3]] : {self.ty(['T', heads, half, 2])} into {self.ty(['T', heads, HEAD_DIM])}"
        )
        return out

    def cache_update(self, layer, k, v):
        """Writes k and v [T, 3, 64] at positions pos.. of the layer's cache
        global `@kv<layer>` ([2, CONTEXT, 3, 64]: K then V) and returns the
        first L positions of K and of V: [L, 3, 64] each. Both writes come
        before both reads, so the update is in place."""
        cty = KV_TYPE
        c = self.fresh("kv")
        self.emit(f"{c} = util.global.load @kv{layer} : {cty}")
        for which, new in ((0, k), (1, v)):
            u = self.fresh("kv")
            self.emit(
                f"{u} = tensor.insert_slice {new} into {c}[{which}, %pos, 0, 0] [1, {self.tsize()}, {KV_HEADS}, {HEAD_DIM}] [1, 1, 1, 1] : {self.ty(['T', KV_HEADS, HEAD_DIM])} into {cty}"
            )
            c = u
        self.emit(f"util.global.store {c}, @kv{layer} : {cty}")
        out = []
        for which in (0, 1):
            s = self.fresh("kv")
            self.emit(
                f"{s} = tensor.extract_slice {c}[{which}, 0, 0, 0] [1, %L, {KV_HEADS}, {HEAD_DIM}] [1, 1, 1, 1] : {cty} to {self.ty(['L', KV_HEADS, HEAD_DIM])}"
            )
            out.append(s)
        return out

    def attention(self, q, k, v):
        """q: [T, 9, 64] (roped); k, v: [L, 3, 64] -> [T, 576]. Query head
        g*3+r reads KV head g; query t sits at position pos+t and sees
        positions 0..pos+t."""
        qg = self.fresh("q")
        self.emit(
            f"{qg} = tensor.expand_shape {q} [[0], [1, 2], [3]] output_shape [{self.tsize()}, {KV_HEADS}, {GROUP}, {HEAD_DIM}] : {self.ty(['T', HEADS, HEAD_DIM])} into {self.ty(['T', KV_HEADS, GROUP, HEAD_DIM])}"
        )
        kvty = self.ty(["L", KV_HEADS, HEAD_DIM])
        sshape = [KV_HEADS, GROUP, "T", "L"]
        s = self.generic(
            ["g", "r", "t", "l", "d"],
            ["parallel"] * 4 + ["reduction"],
            [(qg, self.ty(["T", KV_HEADS, GROUP, HEAD_DIM]), ["t", "g", "r", "d"], "f32"), (k, kvty, ["l", "g", "d"], "f32")],
            (self.empty(sshape, fill="0.0"), sshape, ["g", "r", "t", "l"]),
            lambda a: [f"%p = arith.mulf {a[0]}, {a[1]} : f32", f"%r = arith.addf {a[2]}, %p : f32", "linalg.yield %r : f32"],
        )
        # Scale and causal mask.
        sm = self.generic(
            ["g", "r", "t", "l"],
            ["parallel"] * 4,
            [(s, self.ty(sshape), ["g", "r", "t", "l"], "f32")],
            (self.empty(sshape), sshape, ["g", "r", "t", "l"]),
            lambda a: [
                "%t = linalg.index 2 : index",
                "%l = linalg.index 3 : index",
                "%tp = arith.addi %t, %pos : index",
                "%future = arith.cmpi ugt, %l, %tp : index",
                f"%scale = arith.constant {1.0 / HEAD_DIM ** 0.5:.9e} : f32",
                f"%y = arith.mulf {a[0]}, %scale : f32",
                "%ninf = arith.constant 0xFF800000 : f32",
                "%r = arith.select %future, %ninf, %y : f32",
                "linalg.yield %r : f32",
            ],
        )
        rshape = [KV_HEADS, GROUP, "T"]
        mx = self.generic(
            ["g", "r", "t", "l"],
            ["parallel"] * 3 + ["reduction"],
            [(sm, self.ty(sshape), ["g", "r", "t", "l"], "f32")],
            (self.empty(rshape, fill="0xFF800000"), rshape, ["g", "r", "t"]),
            lambda a: [f"%r = arith.maximumf {a[0]}, {a[1]} : f32", "linalg.yield %r : f32"],
        )
        e = self.generic(
            ["g", "r", "t", "l"],
            ["parallel"] * 4,
            [(sm, self.ty(sshape), ["g", "r", "t", "l"], "f32"), (mx, self.ty(rshape), ["g", "r", "t"], "f32")],
            (self.empty(sshape), sshape, ["g", "r", "t", "l"]),
            lambda a: [f"%d = arith.subf {a[0]}, {a[1]} : f32", "%r = math.exp %d : f32", "linalg.yield %r : f32"],
        )
        sums = self.generic(
            ["g", "r", "t", "l"],
            ["parallel"] * 3 + ["reduction"],
            [(e, self.ty(sshape), ["g", "r", "t", "l"], "f32")],
            (self.empty(rshape, fill="0.0"), rshape, ["g", "r", "t"]),
            lambda a: [f"%r = arith.addf {a[1]}, {a[0]} : f32", "linalg.yield %r : f32"],
        )
        oshape = ["T", KV_HEADS, GROUP, HEAD_DIM]
        o = self.generic(
            ["t", "g", "r", "d", "l"],
            ["parallel"] * 4 + ["reduction"],
            [(e, self.ty(sshape), ["g", "r", "t", "l"], "f32"), (v, kvty, ["l", "g", "d"], "f32")],
            (self.empty(oshape, fill="0.0"), oshape, ["t", "g", "r", "d"]),
            lambda a: [f"%p = arith.mulf {a[0]}, {a[1]} : f32", f"%r = arith.addf {a[2]}, %p : f32", "linalg.yield %r : f32"],
        )
        on = self.generic(
            ["t", "g", "r", "d"],
            ["parallel"] * 4,
            [(o, self.ty(oshape), ["t", "g", "r", "d"], "f32"), (sums, self.ty(rshape), ["g", "r", "t"], "f32")],
            (self.empty(oshape), oshape, ["t", "g", "r", "d"]),
            lambda a: [f"%r = arith.divf {a[0]}, {a[1]} : f32", "linalg.yield %r : f32"],
        )
        out = self.fresh("a")
        self.emit(f"{out} = tensor.collapse_shape {on} [[0], [1, 2, 3]] : {self.ty(oshape)} into {self.ty(['T', DIM])}")
        return out

    def embed(self, ids):
        """ids: [T] i32 -> [T, 576] f32 rows of the Q8_0 token_embd (ids
        clamped into range; the host checks them)."""
        b = DIM // 32
        wty = _global_type("Q8_0", (VOCAB, DIM))
        w = self.fresh("w")
        self.emit(f"{w} = util.global.load @{_sym('token_embd.weight')} : {wty}")
        g = self.generic(
            ["t", "b", "j"],
            ["parallel"] * 3,
            [(ids, self.ty(["T"], "i32"), ["t"], "i32")],
            (self.empty(["T", b, 32]), ["T", b, 32], ["t", "b", "j"]),
            lambda a: [
                "%zero = arith.constant 0 : i32",
                f"%top = arith.constant {VOCAB - 1} : i32",
                f"%lo = arith.maxsi {a[0]}, %zero : i32",
                "%id = arith.minsi %lo, %top : i32",
                "%row = arith.index_cast %id : i32 to index",
                "%b = linalg.index 1 : index",
                "%j = linalg.index 2 : index",
                "%c0 = arith.constant 0 : index",
                "%c1 = arith.constant 1 : index",
                "%c2 = arith.constant 2 : index",
                "%jq = arith.addi %j, %c2 : index",
                f"%bl = tensor.extract {w}[%row, %b, %c0] : {wty}",
                f"%bh = tensor.extract {w}[%row, %b, %c1] : {wty}",
                f"%q = tensor.extract {w}[%row, %b, %jq] : {wty}",
                *self.f16_lines("%bl", "%bh", "%d"),
                "%qf = arith.sitofp %q : i8 to f32",
                "%r = arith.mulf %d, %qf : f32",
                "linalg.yield %r : f32",
            ],
        )
        out = self.fresh("x")
        self.emit(f"{out} = tensor.collapse_shape {g} [[0], [1, 2]] : {self.ty(['T', b, 32])} into {self.ty(['T', DIM])}")
        return out

    def logits(self, x):
        """x: [1, 576] (normed) -> [VOCAB] through the tied Q8_0 token_embd.

        The 32 values of a block are read as two halves of 16 (one generic
        over (v, block, j < 16) with both halves in its body): the same
        16-lane shape as the Q4_1 matvec, which the pinned compiler
        vectorizes; one reduction over j < 32 ran 2.5x slower (6.0 against
        2.5 ms for 8192 rows, 2 loaded cores)."""
        b = DIM // 32
        wty = _global_type("Q8_0", (VOCAB, DIM))
        w = self.fresh("w")
        self.emit(f"{w} = util.global.load @{_sym('token_embd.weight')} : {wty}")
        xe = self.fresh("x")
        self.emit(f"{xe} = tensor.expand_shape {x} [[0], [1, 2]] output_shape [1, {b}, 32] : tensor<1x{DIM}xf32> into tensor<1x{b}x32xf32>")
        halves = []
        for h in range(2):
            v = self.fresh("x")
            self.emit(
                f"{v} = tensor.extract_slice {xe}[0, 0, {16 * h}] [1, {b}, 16] [1, 1, 1] : tensor<1x{b}x32xf32> to tensor<1x{b}x16xf32>"
            )
            halves.append(v)
        q0, qty = self.slice_bytes(w, wty, VOCAB, b, 34, 2, 16)
        q1, _ = self.slice_bytes(w, wty, VOCAB, b, 34, 18, 16)
        dl, dlty = self.slice_bytes(w, wty, VOCAB, b, 34, 0, 1)
        dh, _ = self.slice_bytes(w, wty, VOCAB, b, 34, 1, 1)
        xty = f"tensor<1x{b}x16xf32>"
        return self.generic(
            ["v", "b", "j"],
            ["parallel", "reduction", "reduction"],
            [
                (halves[0], xty, ["0", "b", "j"], "f32"),
                (halves[1], xty, ["0", "b", "j"], "f32"),
                (q0, qty, ["v", "b", "j"], "i8"),
                (q1, qty, ["v", "b", "j"], "i8"),
                (dl, dlty, ["v", "b"], "i8"),
                (dh, dlty, ["v", "b"], "i8"),
            ],
            (self.empty([VOCAB], fill="0.0"), [VOCAB], ["v"]),
            lambda a: [
                *self.f16_lines(a[4], a[5], "%d"),
                f"%fa = arith.sitofp {a[2]} : i8 to f32",
                f"%fb = arith.sitofp {a[3]} : i8 to f32",
                f"%pa = arith.mulf {a[0]}, %fa : f32",
                f"%pb = arith.mulf {a[1]}, %fb : f32",
                "%s = arith.addf %pa, %pb : f32",
                "%p = arith.mulf %s, %d : f32",
                f"%r = arith.addf {a[6]}, %p : f32",
                "linalg.yield %r : f32",
            ],
        )

    def forward(self, ids):
        """The whole model over ids [T] at positions pos..; returns the
        logits of the last token."""
        x = self.embed(ids)
        kvd = KV_HEADS * HEAD_DIM
        for i in range(LAYERS):
            p = f"blk.{i}."
            h = self.rmsnorm(x, p + "attn_norm.weight")
            q = self.rope(self.matmul_q4_1(h, p + "attn_q.weight", DIM, DIM), HEADS)
            k = self.rope(self.matmul_q4_1(h, p + "attn_k.weight", kvd, DIM), KV_HEADS)
            v0 = self.matmul_q4_1(h, p + "attn_v.weight", kvd, DIM)
            v = self.fresh("v")
            self.emit(
                f"{v} = tensor.expand_shape {v0} [[0], [1, 2]] output_shape [{self.tsize()}, {KV_HEADS}, {HEAD_DIM}] : {self.ty(['T', kvd])} into {self.ty(['T', KV_HEADS, HEAD_DIM])}"
            )
            kc, vc = self.cache_update(i, k, v)
            a = self.attention(q, kc, vc)
            x = self.add(x, self.matmul_q4_1(a, p + "attn_output.weight", DIM, DIM), ["T", DIM])
            h = self.rmsnorm(x, p + "ffn_norm.weight")
            gate = self.matmul_q4_1(h, p + "ffn_gate.weight", FFN, DIM)
            up = self.matmul_q4_1(h, p + "ffn_up.weight", FFN, DIM)
            act = self.generic(
                ["t", "f"],
                ["parallel"] * 2,
                [(gate, self.ty(["T", FFN]), ["t", "f"], "f32"), (up, self.ty(["T", FFN]), ["t", "f"], "f32")],
                (self.empty(["T", FFN]), ["T", FFN], ["t", "f"]),
                lambda a: [
                    f"%n = arith.negf {a[0]} : f32",
                    "%e = math.exp %n : f32",
                    "%one = arith.constant 1.0 : f32",
                    "%den = arith.addf %one, %e : f32",
                    f"%s = arith.divf {a[0]}, %den : f32",
                    f"%r = arith.mulf %s, {a[1]} : f32",
                    "linalg.yield %r : f32",
                ],
            )
            x = self.add(x, self.matmul_q4_1(act, p + "ffn_down.weight", DIM, FFN), ["T", DIM])
        last = self.fresh("x")
        if self.t == 1:
            self.emit(f"{last} = tensor.extract_slice {x}[0, 0] [1, {DIM}] [1, 1] : {self.ty(['T', DIM])} to tensor<1x{DIM}xf32>")
        else:
            self.emit("%Tm1 = arith.subi %T, %one_idx : index")
            self.emit(f"{last} = tensor.extract_slice {x}[%Tm1, 0] [1, {DIM}] [1, 1] : {self.ty(['T', DIM])} to tensor<1x{DIM}xf32>")
        t_saved = self.t
        self.t = 1
        n = self.rmsnorm(last, "output_norm.weight")
        self.t = t_saved
        return self.logits(n)


def _checks(f):
    """Position bookkeeping shared by both entry points: %pos (index), %L =
    pos + T, and the capacity check."""
    f.emit("%pos = arith.index_cast %pos_i32 : i32 to index")
    f.emit("%one_idx = arith.constant 1 : index")
    f.emit("%L = arith.addi %pos, %T : index")
    f.emit("%zero_i32 = arith.constant 0 : i32")
    f.emit("%pos_ok = arith.cmpi sge, %pos_i32, %zero_i32 : i32")
    f.emit(f'cf.assert %pos_ok, "position must not be negative"')
    f.emit(f"%cap = arith.constant {CONTEXT} : index")
    f.emit("%fits = arith.cmpi ule, %L, %cap : index")
    f.emit(f'cf.assert %fits, "positions pass the KV cache capacity of {CONTEXT} (context_length)"')
    f.emit("%has = arith.cmpi uge, %T, %one_idx : index")
    f.emit('cf.assert %has, "at least one token is needed"')


def build_mlir():
    out = ["// Generated by examples/llm/model.py; do not edit.", "module @smollm2 {"]
    for name, kind, shape in weight_specs():
        out.append(
            f'  util.global private @{_sym(name)} = #stream.parameter.named<"model"::"{name}"> : {_global_type(kind, shape)}'
        )
    # Each layer's cache starts filled with its own layer number: the values
    # are never read (attention reads positions < pos + T only, all written
    # first), but with one shared initial value the pinned compiler merged
    # the mutable globals into one (every layer then wrote the same cache:
    # wrong logits from the second position on).
    for i in range(LAYERS):
        out.append(f"  util.global private mutable @kv{i} : {KV_TYPE} = dense<{float(i)}> : {KV_TYPE}")

    f = Fn(None)
    f.emit("%dim0 = arith.constant 0 : index")
    f.emit("%T = tensor.dim %ids, %dim0 : tensor<?xi32>")
    _checks(f)
    r = f.forward("%ids")
    f.emit(f"return {r} : tensor<{VOCAB}xf32>")
    out.append(f"  func.func @prefill(%ids: tensor<?xi32>, %pos_i32: i32) -> tensor<{VOCAB}xf32> {{")
    out += f.lines
    out.append("  }")

    f = Fn(1)
    f.emit("%T = arith.constant 1 : index")
    _checks(f)
    f.emit("%ids = tensor.from_elements %tok_id : tensor<1xi32>")
    f.emit("%id_ok0 = arith.cmpi sge, %tok_id, %zero_i32 : i32")
    f.emit(f"%vocab = arith.constant {VOCAB} : i32")
    f.emit("%id_ok1 = arith.cmpi slt, %tok_id, %vocab : i32")
    f.emit("%id_ok = arith.andi %id_ok0, %id_ok1 : i1")
    f.emit(f'cf.assert %id_ok, "token id out of range 0..{VOCAB}"')
    r = f.forward("%ids")
    f.emit(f"return {r} : tensor<{VOCAB}xf32>")
    out.append(f"  func.func @decode(%tok_id: i32, %pos_i32: i32) -> tensor<{VOCAB}xf32> {{")
    out += f.lines
    out.append("  }")

    out.append("  func.func @context_length() -> i32 {")
    out.append(f"    %c = arith.constant {CONTEXT} : i32")
    out.append("    return %c : i32")
    out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(build_mlir())
