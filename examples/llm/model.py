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
The prefill of a prompt of more than PREFILL_FUSED_MAX tokens instead
dequantizes each matrix into a transient f32 copy (at most 3.4 MB, made per
call and dropped after its product; never a global: generate.py compiles with
constant-expression hoisting off) and multiplies all rows at once.

Entry points (the KV cache is program state: one mutable global `@kv<layer>`
per layer holding its K and V, `tensor<2x?x3x64xf32>`, its capacity the
dynamic dimension, updated in place):

    init_cache(n: i32) -> i32
        (re)allocates every layer's cache for n positions (1..MAX_CONTEXT) on
        the device and returns n; the host calls it once after loading with
        the context its user asked for (until then the capacity is 1);
    prefill(ids: tensor<?xi32>, pos: i32) -> tensor<VOCAB x f32>
        appends len(ids) tokens at positions pos.. and returns the logits of
        the last one;
    decode(id: i32, pos: i32) -> tensor<VOCAB x f32>
        the same for one token;
    context_length() -> i32
        the KV cache's capacity (the dimension of `@kv0`).

A call whose positions would pass the capacity fails with a clear error
(`cf.assert` on the cache's dimension) instead of writing outside the cache. Attention reads only the
first pos + len positions of the cache (dynamic shapes), so a step costs what
its context costs, not the capacity's.

The cuda program's decode (build_mlir(gpu=True)) reads its position from a
one-element device tensor instead: RoPE, the cache write (a scatter) and the
causal mask take it from device memory, and attention spans pos + 1
positions rounded up to ATTEND_ROUND (the rest masked), so consecutive steps
launch the same kernels with the same parameters and the runtime replays
one CUDA graph of the step without updating its nodes (Fn.device_pos).
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
# The largest cache `init_cache` accepts: the GGUF's `llama.context_length`
# (the context SmolLM2 was trained for). Hosts default to DEFAULT_CONTEXT.
MAX_CONTEXT = 8192
DEFAULT_CONTEXT = 2048

# One layer's KV cache: [K or V, position, KV head, head dim]; the number of
# positions is chosen at run time (init_cache).
KV_TYPE = f"tensor<2x?x{KV_HEADS}x{HEAD_DIM}xf32>"


def kv_bytes(context):
    """Bytes of the single-sequence program's KV cache for `context` positions."""
    return LAYERS * 2 * context * KV_HEADS * HEAD_DIM * 4

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


class Normed:
    """An RMS-normed activation not yet materialized (the cuda decode step
    and the cuda batch program's decode_batch and step): the rows x [T,
    DIM], their sums of squares ss [T] and the norm's weight g [DIM];
    matmul_q4_1_gpu and matmul_q4_1_gpu_rows apply the norm as they read x,
    which saves the norm's own elementwise dispatch."""

    def __init__(self, x, ss, g):
        self.x, self.ss, self.g = x, ss, g


class Fn:
    """Emits one function body. `t` is the token count: an int (static) or
    None (dynamic, the SSA index %T)."""

    def __init__(self, t, mode="single", gpu=False, dequant_once=None):
        self.t = t
        # The cuda program's formulation (build_mlir(gpu=True)): the same
        # math, with the one-row kernels (decode, the LM head) written
        # without a unit row dimension and given compilation configs of
        # ours (matmul_q4_1_gpu, _q8_head_gpu, attention_pv_gpu,
        # row_reduce_gpu), and prefill's matrices dequantized once per call
        # (matmul_q4_1_wide).
        self.gpu = gpu
        # Multiply every Q4_1 matrix as an f32 copy dequantized once per
        # call (matmul_q4_1_wide) instead of the fused kernel, which
        # dequantizes it again for every row: the cuda program's prefill,
        # and the CPU program's prefill of more than PREFILL_FUSED_MAX tokens.
        self.dequant_once = gpu if dequant_once is None else dequant_once
        # matmul_rows pads the rows to a multiple of 8 (the CPU prefill:
        # see matmul_rows_padded).
        self.pad_rows = False
        # "single": the one-sequence program (cache `@kv<layer>`, rows at
        # positions %pos + t); "slot": prefill of one slot of the batch
        # program (%slot, positions %pos + t); "batch": decode_batch, row t
        # is its own sequence (slot %slotv[t], position %posv[t]); "wide":
        # "batch" with the Q4_1 matrices dequantized once per call and
        # shared by all rows (decode_batch_wide, for many rows).
        self.mode = mode
        self.batched = mode in ("batch", "wide")
        # The cuda decode step reads its position from device memory
        # (`%posv`, tensor<1xi32>) instead of taking it as a push constant
        # of every kernel that uses it (rope, the cache write, the mask):
        # with the attended length rounded up to ATTEND_ROUND positions,
        # consecutive steps then launch the same kernels with the same
        # parameters, so a CUDA graph of the step is replayed without
        # updating its nodes (build_mlir(gpu=True), `device_pos`).
        self.device_pos = False
        # Set by _step_checks: the i32 vector of rows whose logits a step
        # call returns (None: every row's, as decode_batch).
        self.out_rows = None
        self.lines = []
        self.n = 0

    def fresh(self, p="v"):
        self.n += 1
        return f"%{p}_{self.n}"

    def emit(self, s):
        self.lines.append("    " + s)

    # Shapes: entries are ints, "T" (tokens), "L" (attended positions) or
    # "O" (the rows a step call returns logits for).
    def dim(self, d):
        if d == "T":
            return "?" if self.t is None else str(self.t)
        if d in ("L", "O", "P8"):
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
            elif d == "P8":
                out.append("%T8")
            elif d == "O":
                out.append("%O")
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
        if self.gpu and self.t == 1:
            return self.matmul_q4_1_gpu(x, name, n, k)
        if self.gpu and self.batched:
            return self.matmul_q4_1_gpu_rows(x, name, n, k)
        if self.mode == "wide" or self.dequant_once:
            return self.matmul_q4_1_wide(x, name, n, k)
        return self.matmul_q4_1_fused(x, name, n, k)

    def generic_cfg(self, cfg, *args, **kwargs):
        """`generic` with a `compilation_info` attribute `cfg` (None: none)."""
        v = self.generic(*args, **kwargs)
        if cfg is not None:
            for i in range(len(self.lines) - 1, -1, -1):
                if self.lines[i].lstrip().startswith(f"{v} = linalg.generic"):
                    assert self.lines[i].endswith(" {")
                    self.lines[i] = self.lines[i][:-2] + f" attrs = {{compilation_info = {cfg}}} {{"
                    break
        return v

    @staticmethod
    def warp_rows_cfg(rows, blocks, width, split=1):
        """The cuda compilation config of a one-row block matvec generic over
        (n, block, j < width), block and j reductions: `split` 32-lane
        subgroups per row, `rows` rows per workgroup; lane l takes j = l % 16
        (and j + 16 when width is 32) of the blocks of its half (l / 16) of
        its subgroup's part of the row, so a row is read in one pass with no
        loop over blocks, and its sum is 5 subgroup shuffles (and a
        shared-memory step when split > 1). The pinned compiler's own choice
        for this generic is one thread per j and a serial loop over the
        blocks (16 threads a row: 9 to 26 us a launch on an H200,
        latency-bound)."""
        assert blocks % (2 * split) == 0 and width % 16 == 0
        lc = (
            f"#iree_gpu.lowering_config<{{lane_basis = [[1, 2, 16], [0, 1, 2]], partial_reduction = [0, {blocks}, {width}], "
            f"subgroup_basis = [[{rows}, {split}, 1], [0, 1, 2]], thread = [0, {blocks // (2 * split)}, {width // 16}], "
            f"workgroup = [{rows}, 0, 0]}}>"
        )
        ti = (
            f"#iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<VectorDistribute> "
            f"workgroup_size = [{32 * rows * split}, 1, 1] subgroup_size = 32>"
        )
        return f"#iree_codegen.compilation_info<lowering_config = {lc}, translation_info = {ti}>"

    @staticmethod
    def warp_rows_cfg_t(rows, blocks, width, split=1):
        """warp_rows_cfg for the same generic with a leading parallel row
        dimension t (the cuda batch program's kernels over (t, n, block,
        j)): a workgroup per (row t, `rows` matrix rows), the matrix blocks
        read again for every t (from L2: a Q4_1 matrix is at most 0.5 MB)."""
        assert blocks % (2 * split) == 0 and width % 16 == 0
        lc = (
            f"#iree_gpu.lowering_config<{{lane_basis = [[1, 1, 2, 16], [0, 1, 2, 3]], partial_reduction = [0, 0, {blocks}, {width}], "
            f"subgroup_basis = [[1, {rows}, {split}, 1], [0, 1, 2, 3]], thread = [0, 0, {blocks // (2 * split)}, {width // 16}], "
            f"workgroup = [1, {rows}, 0, 0]}}>"
        )
        ti = (
            f"#iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<VectorDistribute> "
            f"workgroup_size = [{32 * rows * split}, 1, 1] subgroup_size = 32>"
        )
        return f"#iree_codegen.compilation_info<lowering_config = {lc}, translation_info = {ti}>"

    @staticmethod
    def gpu_split(b):
        """Subgroups per matrix row so that a lane takes at most 9 blocks
        (matmul_q4_1_gpu)."""
        return next(s for s in range(1, b + 1) if b % (2 * s) == 0 and b // (2 * s) <= 9)

    @classmethod
    def q4_1_step_body(cls, a):
        """The body of a Q4_1 matvec step over (block, j < 16): x values j
        and 16 + j of the block (a[0], a[1]) times the two nibbles of byte j
        (a[2]) dequantized with the block's f16 d (a[3], a[4]) and m (a[5],
        a[6]), added to the accumulator a[7]."""
        x0, x1, q, dl, dh, ml, mh, acc = a
        return [
            *cls.f16_lines(dl, dh, "%d"),
            *cls.f16_lines(ml, mh, "%m"),
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

    def matmul_q4_1_gpu(self, x, name, n, k):
        """The cuda program's one-row matvec: x [1, k] times the Q4_1 matrix
        `name` [n, k] transposed, [1, n]. The math and operands of
        matmul_q4_1_fused with no row dimension (a unit dimension is folded
        away by the compiler, and with it a compilation config) and with the
        config of warp_rows_cfg."""
        b = k // 32
        wty = _global_type("Q4_1", (n, k))
        w = self.fresh("w")
        self.emit(f"{w} = util.global.load @{_sym(name)} : {wty}")
        normed = x if isinstance(x, Normed) else None
        if normed is not None:
            x = normed.x

        def halves_of(src, ty):
            e = self.fresh("x")
            self.emit(f"{e} = tensor.expand_shape {src} [[0], [1, 2, 3]] output_shape [1, {b}, 2, 16] : {ty} into tensor<1x{b}x2x16xf32>")
            out = []
            for h in range(2):
                v = self.fresh("x")
                self.emit(f"{v} = tensor.extract_slice {e}[0, 0, {h}, 0] [1, {b}, 1, 16] [1, 1, 1, 1] : tensor<1x{b}x2x16xf32> to tensor<{b}x16xf32>")
                out.append(v)
            return out

        halves = halves_of(x, f"tensor<1x{k}xf32>")
        qs, qty = self.slice_bytes(w, wty, n, b, 20, 4, 16)
        parts = [self.slice_bytes(w, wty, n, b, 20, o, 1) for o in range(4)]


        ins = [(hv, f"tensor<{b}x16xf32>", ["b", "j"], "f32") for hv in halves]
        ins += [(qs, qty, ["n", "b", "j"], "i8")]
        ins += [(p, pty, ["n", "b"], "i8") for (p, pty) in parts]
        body = self.q4_1_step_body
        if normed is not None:
            ge = self.fresh("n")
            self.emit(f"{ge} = tensor.expand_shape {normed.g} [[0, 1]] output_shape [1, {k}] : tensor<{k}xf32> into tensor<1x{k}xf32>")
            ss0 = self.fresh("n")
            self.emit(f"{ss0} = tensor.collapse_shape {normed.ss} [] : tensor<1xf32> into tensor<f32>")
            ins += [(gh, f"tensor<{b}x16xf32>", ["b", "j"], "f32") for gh in halves_of(ge, f"tensor<1x{k}xf32>")]
            ins += [(ss0, "tensor<f32>", [], "f32")]

            def body(a):
                x0, x1, q, dl, dh, ml, mh, g0, g1, ss, acc = a
                return [
                    *self.norm_lines(x0, ss, g0, "%z0"),
                    *self.norm_lines(x1, ss, g1, "%z1"),
                    *self.q4_1_step_body(["%z0", "%z1", q, dl, dh, ml, mh, acc]),
                ]

        out = self.empty([n], fill="0.0")
        # Subgroups per row so that a lane takes at most 9 blocks: ffn_down's
        # 48 blocks a row as one subgroup (24 blocks a lane) took 23 us a
        # launch on an H200 against 8 us for the 18-block matrices.
        split = self.gpu_split(b)
        r = self.generic_cfg(
            self.warp_rows_cfg(2 if n <= 576 else 4, b, 16, split),
            ["n", "b", "j"],
            ["parallel", "reduction", "reduction"],
            ins,
            (out, [n], ["n"]),
            body,
        )
        o = self.fresh("x")
        self.emit(f"{o} = tensor.expand_shape {r} [[0, 1]] output_shape [1, {n}] : tensor<{n}xf32> into tensor<1x{n}xf32>")
        return o

    def q4_1_operands(self, x, name, n, k):
        """The operands of the fused Q4_1 generics over (t, n, block, j <
        16): x [T, k] as its two halves of each block ([T, blocks, 16] for
        values j and 16 + j), the matrix's packed bytes [n, blocks, 16] and
        its four scale/min bytes [n, blocks] each. Returns (blocks, halves,
        bytes, their type, [(byte, type)] * 4)."""
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
        return b, halves, qs, qty, parts

    def matmul_q4_1_gpu_rows(self, x, name, n, k):
        """The cuda batch program's matmul: x [T, k] (T rows of their own
        sequences) times the Q4_1 matrix `name` [n, k] transposed, [T, n].
        matmul_q4_1_fused's generic (t, n, block, j < 16) with the config of
        warp_rows_cfg_t: matmul_q4_1_gpu's one-row kernel for every row.
        The pinned compiler's own kernels for the fused generic and for
        decode_batch_wide's f32 matmul were 5-36 us a launch at 16 rows on
        an H100 against 6-8 us for the one-row kernel."""
        normed = x if isinstance(x, Normed) else None
        if normed is not None:
            x = normed.x
        b, halves, qs, qty, parts = self.q4_1_operands(x, name, n, k)
        ins = [(hv, self.ty(["T", b, 16]), ["t", "b", "j"], "f32") for hv in halves]
        ins += [(qs, qty, ["n", "b", "j"], "i8")]
        ins += [(p, pty, ["n", "b"], "i8") for (p, pty) in parts]
        body = self.q4_1_step_body
        if normed is not None:
            # The layer norm applied as x is read (as matmul_q4_1_gpu):
            # the norm's weight in halves [b, 16] and each row's sum of
            # squares ss[t].
            ge = self.fresh("n")
            self.emit(f"{ge} = tensor.expand_shape {normed.g} [[0, 1, 2]] output_shape [{b}, 2, 16] : tensor<{k}xf32> into tensor<{b}x2x16xf32>")
            for h in range(2):
                gh = self.fresh("n")
                self.emit(f"{gh} = tensor.extract_slice {ge}[0, {h}, 0] [{b}, 1, 16] [1, 1, 1] : tensor<{b}x2x16xf32> to tensor<{b}x16xf32>")
                ins.append((gh, f"tensor<{b}x16xf32>", ["b", "j"], "f32"))
            ins.append((normed.ss, self.ty(["T"]), ["t"], "f32"))

            def body(a):
                x0, x1, q, dl, dh, ml, mh, g0, g1, ss, acc = a
                return [
                    *self.norm_lines(x0, ss, g0, "%z0"),
                    *self.norm_lines(x1, ss, g1, "%z1"),
                    *self.q4_1_step_body(["%z0", "%z1", q, dl, dh, ml, mh, acc]),
                ]

        return self.generic_cfg(
            self.warp_rows_cfg_t(2 if n <= 576 else 4, b, 16, self.gpu_split(b)),
            ["t", "n", "b", "j"],
            ["parallel", "parallel", "reduction", "reduction"],
            ins,
            (self.empty(["T", n], fill="0.0"), ["T", n], ["t", "n"]),
            body,
        )

    def dequant_q4_1(self, name, n, k):
        """The Q4_1 matrix `name` [n, k] as f32 [n, k]: one elementwise
        generic over (n, block, nibble half h, j < 16), value 16h + j of the
        block from byte j's nibble h."""
        b = k // 32
        wty = _global_type("Q4_1", (n, k))
        w = self.fresh("w")
        self.emit(f"{w} = util.global.load @{_sym(name)} : {wty}")
        qs, qty = self.slice_bytes(w, wty, n, b, 20, 4, 16)
        parts = [self.slice_bytes(w, wty, n, b, 20, o, 1) for o in range(4)]
        shape = [n, b, 2, 16]
        deq = self.generic(
            ["n", "b", "h", "j"],
            ["parallel"] * 4,
            [(qs, qty, ["n", "b", "j"], "i8")] + [(p, pty, ["n", "b"], "i8") for (p, pty) in parts],
            (self.empty(shape), shape, ["n", "b", "h", "j"]),
            lambda a: [
                *self.f16_lines(a[1], a[2], "%d"),
                *self.f16_lines(a[3], a[4], "%m"),
                "%h = linalg.index 2 : index",
                "%h8 = arith.index_cast %h : index to i8",
                "%c4 = arith.constant 4 : i8",
                "%sh = arith.muli %h8, %c4 : i8",
                f"%q = arith.shrui {a[0]}, %sh : i8",
                "%c15 = arith.constant 15 : i8",
                "%qq = arith.andi %q, %c15 : i8",
                "%qf = arith.uitofp %qq : i8 to f32",
                "%w = arith.mulf %d, %qf : f32",
                "%wm = arith.addf %w, %m : f32",
                "linalg.yield %wm : f32",
            ],
        )
        out = self.fresh("w")
        self.emit(f"{out} = tensor.collapse_shape {deq} [[0], [1, 2, 3]] : tensor<{n}x{b}x2x16xf32> into tensor<{n}x{k}xf32>")
        return out

    def matmul_rows(self, x, w, n, k):
        """x: [T, k] times f32 w [n, k] transposed: [T, n]."""
        if self.pad_rows:
            return self.matmul_rows_padded(x, w, n, k)
        return self.generic(
            ["t", "n", "k"],
            ["parallel", "parallel", "reduction"],
            [(x, self.ty(["T", k]), ["t", "k"], "f32"), (w, f"tensor<{n}x{k}xf32>", ["n", "k"], "f32")],
            (self.empty(["T", n], fill="0.0"), ["T", n], ["t", "n"]),
            lambda a: [f"%p = arith.mulf {a[0]}, {a[1]} : f32", f"%r = arith.addf {a[2]}, %p : f32", "linalg.yield %r : f32"],
        )

    def matmul_rows_padded(self, x, w, n, k):
        """matmul_rows for the CPU prefill: x's rows padded with zeros to
        %Tp (a multiple of 8) and grouped [%T8, 8, k], the product computed
        for every padded row and its first T rows returned. With a dynamic
        row count alone the pinned compiler's kernel (tiles of 8 rows) runs
        a last partial tile several times slower than a full one: 1536x576,
        one thread, 0.39 ms for 8 rows, 1.2 ms for 9, 0.85 ms for 1; with
        the static 8 and the padding 0.51, 0.72 and 0.39 ms (iree-benchmark-module
        of this kernel alone; padding alone, without the static 8, is folded
        away by the compiler)."""
        z = self.const("0.0", "f32")
        xp = self.fresh("x")
        self.emit(f"{xp} = tensor.pad {x} low[0, 0] high[%Tpad, 0] {{")
        self.emit("^bb0(%i0: index, %i1: index):")
        self.emit(f"  tensor.yield {z} : f32")
        self.emit(f"}} : {self.ty(['T', k])} to tensor<?x{k}xf32>")
        xe = self.fresh("x")
        self.emit(f"{xe} = tensor.expand_shape {xp} [[0, 1], [2]] output_shape [%T8, 8, {k}] : tensor<?x{k}xf32> into tensor<?x8x{k}xf32>")
        z2 = self.const("0.0", "f32")
        e = self.fresh("e")
        self.emit(f"{e} = tensor.empty(%T8) : tensor<?x8x{n}xf32>")
        acc = self.fresh("f")
        self.emit(f"{acc} = linalg.fill ins({z2} : f32) outs({e} : tensor<?x8x{n}xf32>) -> tensor<?x8x{n}xf32>")
        m = self.generic(
            ["b", "t", "n", "k"],
            ["parallel", "parallel", "parallel", "reduction"],
            [(xe, f"tensor<?x8x{k}xf32>", ["b", "t", "k"], "f32"), (w, f"tensor<{n}x{k}xf32>", ["n", "k"], "f32")],
            (acc, ["P8", 8, n], ["b", "t", "n"]),
            lambda a: [f"%p = arith.mulf {a[0]}, {a[1]} : f32", f"%r = arith.addf {a[2]}, %p : f32", "linalg.yield %r : f32"],
        )
        mc = self.fresh("x")
        self.emit(f"{mc} = tensor.collapse_shape {m} [[0, 1], [2]] : tensor<?x8x{n}xf32> into tensor<?x{n}xf32>")
        out = self.fresh("x")
        self.emit(f"{out} = tensor.extract_slice {mc}[0, 0] [%T, {n}] [1, 1] : tensor<?x{n}xf32> to {self.ty(['T', n])}")
        return out

    def matmul_q4_1_wide(self, x, name, n, k):
        """decode_batch_wide's matmul: the matrix dequantized to f32 once
        (its own dispatch: the pinned compiler does not fuse this producer
        into the matmul) and a plain f32 matmul of all rows. The fused
        kernel re-dequantizes the whole matrix for every row, so its cost
        grows with the rows: for 16 rows of a 1536x576 matrix 4.2 ms fused
        against 1.7 ms here (one row fused: 0.28 ms; 2 loaded cores)."""
        return self.matmul_rows(x, self.dequant_q4_1(name, n, k), n, k)

    def matmul_q4_1_fused(self, x, name, n, k):
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
        b, halves, qs, qty, parts = self.q4_1_operands(x, name, n, k)
        out = self.empty(["T", n], fill="0.0")
        dims = ["t", "n", "b", "j"]
        ins = [(hv, self.ty(["T", b, 16]), ["t", "b", "j"], "f32") for hv in halves]
        ins += [(qs, qty, ["n", "b", "j"], "i8")]
        ins += [(p, pty, ["n", "b"], "i8") for (p, pty) in parts]
        return self.generic(
            dims,
            ["parallel", "parallel", "reduction", "reduction"],
            ins,
            (out, ["T", n], ["t", "n"]),
            self.q4_1_step_body,
        )

    def tsize(self):
        return "%T" if self.t is None else str(self.t)

    def rmsnorm_lazy(self, x, name):
        """`rmsnorm` for the matrices that read it: in the cuda decode step
        and the cuda batch program's row kernels a Normed (applied inside
        the matvecs), elsewhere the normed rows."""
        if not (self.gpu and ((self.t == 1 and self.mode == "single") or self.batched)):
            return self.rmsnorm(x, name)
        gty = f"tensor<{DIM}xf32>"
        g = self.fresh("n")
        self.emit(f"{g} = util.global.load @{_sym(name)} : {gty}")
        return Normed(x, self.sum_squares(x, "T"), g)

    def sum_squares(self, x, rows):
        return self.generic(
            ["t", "d"],
            ["parallel", "reduction"],
            [(x, self.ty([rows, DIM]), ["t", "d"], "f32")],
            (self.empty([rows], fill="0.0"), [rows], ["t"]),
            lambda a: [f"%sq = arith.mulf {a[0]}, {a[0]} : f32", f"%r = arith.addf {a[1]}, %sq : f32", "linalg.yield %r : f32"],
        )

    @staticmethod
    def norm_lines(x, ss, g, out):
        """Lines computing `out` = x / sqrt(ss / DIM + EPS) * g."""
        return [
            f"{out}_n = arith.constant {float(DIM):.9e} : f32",
            f"{out}_eps = arith.constant {EPS:.9e} : f32",
            f"{out}_mean = arith.divf {ss}, {out}_n : f32",
            f"{out}_var = arith.addf {out}_mean, {out}_eps : f32",
            f"{out}_rs = math.rsqrt {out}_var : f32",
            f"{out}_y = arith.mulf {x}, {out}_rs : f32",
            f"{out} = arith.mulf {out}_y, {g} : f32",
        ]

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
        ins = [(p, self.ty(["T", heads, half]), ["t", "h", "i"], "f32") for p in parts]
        if self.batched or self.device_pos:
            ins.append(("%posv", self.ty(["T"], "i32"), ["t"], "i32"))
            where = lambda a: [  # noqa: E731
                "%i = linalg.index 2 : index",
                "%c = linalg.index 3 : index",
                f"%tf = arith.sitofp {a[2]} : i32 to f32",
            ]
        else:
            where = lambda a: [  # noqa: E731
                "%t = linalg.index 0 : index",
                "%i = linalg.index 2 : index",
                "%c = linalg.index 3 : index",
                "%tp = arith.addi %t, %pos : index",
                "%tpi = arith.index_cast %tp : index to i64",
                "%tf = arith.sitofp %tpi : i64 to f32",
            ]
        r = self.generic(
            ["t", "h", "i", "c"],
            ["parallel"] * 4,
            ins,
            (self.empty(["T", heads, half, 2]), ["T", heads, half, 2], ["t", "h", "i", "c"]),
            lambda a: [
                *where(a),
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
        if self.mode == "slot":
            return self.slot_cache_update(layer, k, v)
        if self.batched:
            return self.batch_cache_update(layer, k, v)
        if self.device_pos:
            return self.device_pos_cache_update(layer, k, v)
        return self.single_cache_update(layer, k, v)

    def slot_cache_update(self, layer, k, v):
        """The batch program's prefill: writes k and v [T, 3, 64] at
        positions pos.. of slot %slot in `@kv<layer>` ([SLOTS, SLOT_CONTEXT,
        2, 3, 64]) and returns that slot's first L positions of K and V."""
        cty = KVB_TYPE
        c = self.fresh("kv")
        self.emit(f"{c} = util.global.load @kv{layer} : {cty}")
        for which, new in ((0, k), (1, v)):
            u = self.fresh("kv")
            self.emit(
                f"{u} = tensor.insert_slice {new} into {c}[%slot, %pos, {which}, 0, 0] [1, {self.tsize()}, 1, {KV_HEADS}, {HEAD_DIM}] [1, 1, 1, 1, 1] : {self.ty(['T', KV_HEADS, HEAD_DIM])} into {cty}"
            )
            c = u
        self.emit(f"util.global.store {c}, @kv{layer} : {cty}")
        out = []
        for which in (0, 1):
            s = self.fresh("kv")
            self.emit(
                f"{s} = tensor.extract_slice {c}[%slot, 0, {which}, 0, 0] [1, %L, 1, {KV_HEADS}, {HEAD_DIM}] [1, 1, 1, 1, 1] : {cty} to {self.ty(['L', KV_HEADS, HEAD_DIM])}"
            )
            out.append(s)
        return out

    def batch_cache_update(self, layer, k, v):
        """decode_batch: row t's k and v [3, 64] go to slot %slotv[t],
        position %posv[t] of `@kv<layer>` (one `iree_linalg_ext.scatter` of
        the rows, in place on the global); returns each row's K and V
        gathered from its own slot: [T, L, 3, 64] each, L the longest row's
        length (positions past a row's own are masked in attention)."""
        cty = KVB_TYPE
        c = self.fresh("kv")
        self.emit(f"{c} = util.global.load @kv{layer} : {cty}")
        uty = self.ty(["T", 2, KV_HEADS, HEAD_DIM])
        upd = self.empty(["T", 2, KV_HEADS, HEAD_DIM])
        for which, new in ((0, k), (1, v)):
            u = self.fresh("u")
            self.emit(
                f"{u} = tensor.insert_slice {new} into {upd}[0, {which}, 0, 0] [{self.tsize()}, 1, {KV_HEADS}, {HEAD_DIM}] [1, 1, 1, 1] : {self.ty(['T', KV_HEADS, HEAD_DIM])} into {uty}"
            )
            upd = u
        w = self.scatter_into_cache(layer, c, cty, upd, uty, self.kvidx, self.ty(["T", 2], "i32"))
        # Each row's slot, positions 0..L: one iree_linalg_ext.gather of
        # [L, 2, 3, 64] slices (a generic reading the cache element by
        # element with tensor.extract ran ~10x slower).
        lty = f"tensor<{SLOTS}x?x2x{KV_HEADS}x{HEAD_DIM}xf32>"
        head = self.fresh("kv")
        self.emit(
            f"{head} = tensor.extract_slice {w}[0, 0, 0, 0, 0] [{SLOTS}, %L, 2, {KV_HEADS}, {HEAD_DIM}] [1, 1, 1, 1, 1] : {cty} to {lty}"
        )
        gty = self.ty(["T", "L", 2, KV_HEADS, HEAD_DIM])
        g = self.fresh("kv")
        self.emit(
            f"{g} = iree_linalg_ext.gather dimension_map = [0] ins({head}, {self.slot_index} : {lty}, {self.ty(['T', 1], 'i32')}) outs({self.empty(['T', 'L', 2, KV_HEADS, HEAD_DIM])} : {gty}) -> {gty}"
        )
        # The gather stays its own dispatch: fused into the attention
        # dispatches by the pinned compiler it read wrong rows (greedy ids
        # diverged from the third row on).
        gb = self.fresh("kv")
        self.emit(f"{gb} = flow.tensor.clone {g} : {gty}{{{self.tsize()}, %L}}")
        g = gb
        out = []
        for which in (0, 1):
            s = self.fresh("kv")
            self.emit(
                f"{s} = tensor.extract_slice {g}[0, 0, {which}, 0, 0] [{self.tsize()}, %L, 1, {KV_HEADS}, {HEAD_DIM}] [1, 1, 1, 1, 1] : {gty} to {self.ty(['T', 'L', KV_HEADS, HEAD_DIM])}"
            )
            out.append(s)
        return out

    def single_cache_update(self, layer, k, v):
        """Writes k and v [T, 3, 64] at positions pos.. of the layer's cache
        global `@kv<layer>` ([2, capacity, 3, 64]: K then V) and returns the
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
        return self.first_positions(c)

    def scatter_into_cache(self, layer, c, cty, upd, uty, idx, idxty):
        """Writes the rows `upd` into the cache `c` (`@kv<layer>`, of type
        `cty`) at the leading indices `idx` (one `iree_linalg_ext.scatter`,
        in place on the global), stores it back and returns it."""
        w = self.fresh("kv")
        self.emit(
            f"{w} = iree_linalg_ext.scatter dimension_map = [0, 1] unique_indices(true) ins({upd}, {idx} : {uty}, {idxty}) outs({c} : {cty}) {{"
        )
        self.emit("^bb0(%su: f32, %so: f32):")
        self.emit("  iree_linalg_ext.yield %su : f32")
        self.emit(f"}} -> {cty}")
        self.emit(f"util.global.store {w}, @kv{layer} : {cty}")
        return w

    def first_positions(self, c):
        """The first %L positions of K and of V in the single-sequence
        cache `c` ([2, capacity, 3, 64]): [L, 3, 64] each."""
        out = []
        for which in (0, 1):
            s = self.fresh("kv")
            self.emit(
                f"{s} = tensor.extract_slice {c}[{which}, 0, 0, 0] [1, %L, {KV_HEADS}, {HEAD_DIM}] [1, 1, 1, 1] : {KV_TYPE} to {self.ty(['L', KV_HEADS, HEAD_DIM])}"
            )
            out.append(s)
        return out

    def device_pos_cache_update(self, layer, k, v):
        """The cuda decode step's cache write: k and v [1, 3, 64] go to
        position %posv[0] of `@kv<layer>` by one `iree_linalg_ext.scatter`
        (indices [[0, pos], [1, pos]] computed on the device, in place on
        the global); returns the first %L positions of K and of V, %L the
        attended length rounded up (positions past pos are masked)."""
        cty = KV_TYPE
        c = self.fresh("kv")
        self.emit(f"{c} = util.global.load @kv{layer} : {cty}")
        uty = f"tensor<2x{KV_HEADS}x{HEAD_DIM}xf32>"
        upd = self.empty([2, KV_HEADS, HEAD_DIM])
        for which, new in ((0, k), (1, v)):
            u = self.fresh("u")
            self.emit(
                f"{u} = tensor.insert_slice {new} into {upd}[{which}, 0, 0] [1, {KV_HEADS}, {HEAD_DIM}] [1, 1, 1] : {self.ty(['T', KV_HEADS, HEAD_DIM])} into {uty}"
            )
            upd = u
        w = self.scatter_into_cache(layer, c, cty, upd, uty, "%kvidx", "tensor<2x2xi32>")
        return self.first_positions(w)

    def attention(self, q, k, v):
        """q: [T, 9, 64] (roped); k, v: [L, 3, 64] -> [T, 576]. Query head
        g*3+r reads KV head g; query t sits at position pos+t and sees
        positions 0..pos+t."""
        qg = self.fresh("q")
        self.emit(
            f"{qg} = tensor.expand_shape {q} [[0], [1, 2], [3]] output_shape [{self.tsize()}, {KV_HEADS}, {GROUP}, {HEAD_DIM}] : {self.ty(['T', HEADS, HEAD_DIM])} into {self.ty(['T', KV_HEADS, GROUP, HEAD_DIM])}"
        )
        batch = self.batched
        kvty = self.ty(["T", "L", KV_HEADS, HEAD_DIM] if batch else ["L", KV_HEADS, HEAD_DIM])
        kvmap = ["t", "l", "g", "d"] if batch else ["l", "g", "d"]
        sshape = [KV_HEADS, GROUP, "T", "L"]
        s = self.generic(
            ["g", "r", "t", "l", "d"],
            ["parallel"] * 4 + ["reduction"],
            [(qg, self.ty(["T", KV_HEADS, GROUP, HEAD_DIM]), ["t", "g", "r", "d"], "f32"), (k, kvty, kvmap, "f32")],
            (self.empty(sshape, fill="0.0"), sshape, ["g", "r", "t", "l"]),
            lambda a: [f"%p = arith.mulf {a[0]}, {a[1]} : f32", f"%r = arith.addf {a[2]}, %p : f32", "linalg.yield %r : f32"],
        )
        # Scale and causal mask.
        mins = [(s, self.ty(sshape), ["g", "r", "t", "l"], "f32")]
        if batch or self.device_pos:
            # Row t sees positions 0..posv[t] of its own slot (the gathered
            # rows are padded to the longest one).
            mins.append(("%posv", self.ty(["T"], "i32"), ["t"], "i32"))
            last = lambda a: ["%l = linalg.index 3 : index", f"%tp = arith.index_cast {a[1]} : i32 to index"]  # noqa: E731
        else:
            last = lambda a: [  # noqa: E731
                "%t = linalg.index 2 : index",
                "%l = linalg.index 3 : index",
                "%tp = arith.addi %t, %pos : index",
            ]
        sm = self.generic(
            ["g", "r", "t", "l"],
            ["parallel"] * 4,
            mins,
            (self.empty(sshape), sshape, ["g", "r", "t", "l"]),
            lambda a: [
                *last(a),
                "%future = arith.cmpi ugt, %l, %tp : index",
                f"%scale = arith.constant {1.0 / HEAD_DIM ** 0.5:.9e} : f32",
                f"%y = arith.mulf {a[0]}, %scale : f32",
                "%ninf = arith.constant 0xFF800000 : f32",
                "%r = arith.select %future, %ninf, %y : f32",
                "linalg.yield %r : f32",
            ],
        )
        rshape = [KV_HEADS, GROUP, "T"]
        gpu_step = self.gpu and self.t == 1 and not batch
        if gpu_step:
            mx = self.row_reduce_gpu(sm, "0xFF800000", "arith.maximumf")
        else:
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
        # The sum keeps the compiler's config: it shares its dispatch with
        # the division below, which ROW_CFG does not describe (the pinned
        # compiler fails to distribute it).
        sums = self.generic(
            ["g", "r", "t", "l"],
            ["parallel"] * 3 + ["reduction"],
            [(e, self.ty(sshape), ["g", "r", "t", "l"], "f32")],
            (self.empty(rshape, fill="0.0"), rshape, ["g", "r", "t"]),
            lambda a: [f"%r = arith.addf {a[1]}, {a[0]} : f32", "linalg.yield %r : f32"],
        )
        oshape = ["T", KV_HEADS, GROUP, HEAD_DIM]
        if gpu_step:
            o = self.attention_pv_gpu(e, v)
        else:
            o = self.generic(
                ["t", "g", "r", "d", "l"],
                ["parallel"] * 4 + ["reduction"],
                [(e, self.ty(sshape), ["g", "r", "t", "l"], "f32"), (v, kvty, kvmap, "f32")],
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

    # The cuda config of attention_pv_gpu: a workgroup per query head, 16
    # subgroups of 4 head-dim values each, the 32 lanes (2 positions a
    # lane) along the positions, summed by subgroup shuffles. The pinned
    # compiler's own choice is one thread per output with a serial loop over
    # every position (19 us a launch at 70 positions on an H200).
    PV_CFG = (
        "#iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{"
        "lane_basis = [[1, 1, 1, 32], [0, 1, 2, 3]], partial_reduction = [0, 0, 0, 64], "
        "subgroup_basis = [[1, 1, 16, 1], [0, 1, 2, 3]], thread = [0, 0, 4, 2], workgroup = [1, 1, 0, 0]}>, "
        "translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<VectorDistribute> "
        "workgroup_size = [512, 1, 1] subgroup_size = 32>>"
    )

    # The cuda config of row_reduce_gpu: a subgroup per query head, 2
    # positions a lane per pass. The pinned compiler's own choice is 1024
    # threads per head, 4096 positions a pass (all but pos + 1 masked).
    ROW_CFG = (
        "#iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{"
        "lane_basis = [[1, 32], [0, 1]], partial_reduction = [0, 64], "
        "subgroup_basis = [[1, 1], [0, 1]], thread = [0, 2], workgroup = [1, 0]}>, "
        "translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<VectorDistribute> "
        "workgroup_size = [32, 1, 1] subgroup_size = 32>>"
    )

    def row_reduce_gpu(self, src, init, op):
        """The cuda decode step's softmax maximum: src [3, 3, 1, L] ->
        [3, 3, 1], combined by the arith op `op` from `init`, with no query
        dimension (so the config ROW_CFG survives)."""
        heads = KV_HEADS * GROUP
        c = self.fresh("e")
        self.emit(
            f"{c} = tensor.collapse_shape {src} [[0, 1], [2, 3]] : tensor<{KV_HEADS}x{GROUP}x1x?xf32> into tensor<{heads}x?xf32>"
        )
        r = self.generic_cfg(
            self.ROW_CFG,
            ["h", "l"],
            ["parallel", "reduction"],
            [(c, f"tensor<{heads}x?xf32>", ["h", "l"], "f32")],
            (self.empty([heads], fill=init), [heads], ["h"]),
            lambda a: [f"%r = {op} {a[1]}, {a[0]} : f32", "linalg.yield %r : f32"],
        )
        out = self.fresh("e")
        self.emit(
            f"{out} = tensor.expand_shape {r} [[0, 1, 2]] output_shape [{KV_HEADS}, {GROUP}, 1] : tensor<{heads}xf32> into tensor<{KV_HEADS}x{GROUP}x1xf32>"
        )
        return out

    def attention_pv_gpu(self, e, v):
        """The cuda decode step's attention-weighted sum of V: e [3, 3, 1, L]
        (unnormalized weights) and v [L, 3, 64] -> [1, 3, 3, 64], the
        product of `attention` with no query dimension (so the config
        PV_CFG survives) and its positions distributed over lanes."""
        ec = self.fresh("e")
        self.emit(
            f"{ec} = tensor.collapse_shape {e} [[0], [1], [2, 3]] : tensor<{KV_HEADS}x{GROUP}x1x?xf32> into tensor<{KV_HEADS}x{GROUP}x?xf32>"
        )
        oshape = [KV_HEADS, GROUP, HEAD_DIM]
        o = self.generic_cfg(
            self.PV_CFG,
            ["g", "r", "d", "l"],
            ["parallel"] * 3 + ["reduction"],
            [(ec, f"tensor<{KV_HEADS}x{GROUP}x?xf32>", ["g", "r", "l"], "f32"), (v, self.ty(["L", KV_HEADS, HEAD_DIM]), ["l", "g", "d"], "f32")],
            (self.empty(oshape, fill="0.0"), oshape, ["g", "r", "d"]),
            lambda a: [f"%p = arith.mulf {a[0]}, {a[1]} : f32", f"%r = arith.addf {a[2]}, %p : f32", "linalg.yield %r : f32"],
        )
        out = self.fresh("a")
        self.emit(
            f"{out} = tensor.expand_shape {o} [[0, 1], [2], [3]] output_shape [1, {KV_HEADS}, {GROUP}, {HEAD_DIM}] : tensor<{KV_HEADS}x{GROUP}x{HEAD_DIM}xf32> into tensor<1x{KV_HEADS}x{GROUP}x{HEAD_DIM}xf32>"
        )
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

    # Blocks of the LM head's rows summed in one step of its kernel (see
    # `logits`): 18 blocks a row = 3 groups of 6.
    HEAD_GROUP = 6

    def logits(self, x):
        """x: [1, 576] (normed) -> [VOCAB] through the tied Q8_0 token_embd.

        One generic over (v, group g, j < 16) with g and j as reductions,
        whose body holds the HEAD_GROUP blocks of group g unrolled: each
        block's two 16-byte halves, its two scale bytes and its x halves are
        operands of their own. The pinned compiler vectorizes the innermost
        reduction j and sums the lanes of every (row, g) step into the row's
        scalar. With one block a step (the earlier form: (v, block, j < 16),
        both halves in the body) that lane sum and its scalar add came once
        per 32 values: 8.1 ms a call for the 30 MB, the same rate per byte
        as a Q4_1 matvec of this shape (4.9 ms for 17.7 MB). With 6 blocks
        a step: 5.0 ms (groups of 2, 3, 9: 6.3, 5.7, 6.0 ms; a block as one
        32-byte operand: 5.5-6.2 ms; per-lane sums (v, j | block) then a
        lane sum: 23-28 ms, the compiler vectorizes the block dimension).
        A module of this kernel alone (the weight an argument, random
        blocks), `ferrite benchmark-module --device=local-sync`, process
        time per call, medians of interleaved rounds, load average ~10 on
        2 cores, x86-64-v3."""
        if self.gpu:
            return self._q8_head_gpu(x)
        return self._q8_head(x, None)

    def _q8_head_gpu(self, x):
        """`logits` in the cuda program: one generic over (v, block, j < 32)
        with block and j as reductions, each step one packed value d * q[j]
        times x, and the config of warp_rows_cfg (a subgroup per row, 4
        rows a workgroup). `_q8_head`'s grouped form compiles for cuda to
        one thread per 16 rows summing them serially: 0.93 ms a call on an
        H200 (a sixth of the step)."""
        b = DIM // 32
        wty = _global_type("Q8_0", (VOCAB, DIM))
        w = self.fresh("w")
        self.emit(f"{w} = util.global.load @{_sym('token_embd.weight')} : {wty}")
        xe = self.fresh("x")
        self.emit(f"{xe} = tensor.collapse_shape {x} [[0, 1]] : tensor<1x{DIM}xf32> into tensor<{DIM}xf32>")
        xb = self.fresh("x")
        self.emit(f"{xb} = tensor.expand_shape {xe} [[0, 1]] output_shape [{b}, 32] : tensor<{DIM}xf32> into tensor<{b}x32xf32>")
        qs, qty = self.slice_bytes(w, wty, VOCAB, b, 34, 2, 32)
        parts = [self.slice_bytes(w, wty, VOCAB, b, 34, o, 1) for o in range(2)]
        ins = [(xb, f"tensor<{b}x32xf32>", ["b", "j"], "f32"), (qs, qty, ["v", "b", "j"], "i8")]
        ins += [(p, pty, ["v", "b"], "i8") for (p, pty) in parts]
        return self.generic_cfg(
            self.warp_rows_cfg(4, b, 32),
            ["v", "b", "j"],
            ["parallel", "reduction", "reduction"],
            ins,
            (self.empty([VOCAB], fill="0.0"), [VOCAB], ["v"]),
            lambda a: [
                *self.f16_lines(a[2], a[3], "%d"),
                f"%qf = arith.sitofp {a[1]} : i8 to f32",
                "%wv = arith.mulf %d, %qf : f32",
                f"%p = arith.mulf {a[0]}, %wv : f32",
                f"%r = arith.addf {a[4]}, %p : f32",
                "linalg.yield %r : f32",
            ],
        )

    def logits_rows(self, x, rows="T"):
        """x: [rows, 576] (normed) -> [rows, VOCAB]: `logits` for every row
        (the same kernel with a row dimension; for 4 rows 14.8 ms a call
        against 30 ms for the earlier one-block-a-step form, measured as in
        `logits`)."""
        if self.gpu:
            return self._q8_head_gpu_rows(x, rows)
        return self._q8_head(x, rows)

    def _q8_head_gpu_rows(self, x, rows):
        """`logits_rows` in the cuda batch program: _q8_head_gpu's generic
        with a leading row dimension t and the config of warp_rows_cfg_t
        (a subgroup per vocabulary row, 4 a workgroup, per row t)."""
        b = DIM // 32
        wty = _global_type("Q8_0", (VOCAB, DIM))
        w = self.fresh("w")
        self.emit(f"{w} = util.global.load @{_sym('token_embd.weight')} : {wty}")
        size = "%O" if rows == "O" else self.tsize()
        xb = self.fresh("x")
        self.emit(
            f"{xb} = tensor.expand_shape {x} [[0], [1, 2]] output_shape [{size}, {b}, 32] : {self.ty([rows, DIM])} into {self.ty([rows, b, 32])}"
        )
        qs, qty = self.slice_bytes(w, wty, VOCAB, b, 34, 2, 32)
        parts = [self.slice_bytes(w, wty, VOCAB, b, 34, o, 1) for o in range(2)]
        ins = [(xb, self.ty([rows, b, 32]), ["t", "b", "j"], "f32"), (qs, qty, ["v", "b", "j"], "i8")]
        ins += [(p, pty, ["v", "b"], "i8") for (p, pty) in parts]
        return self.generic_cfg(
            self.warp_rows_cfg_t(4, b, 32),
            ["t", "v", "b", "j"],
            ["parallel", "parallel", "reduction", "reduction"],
            ins,
            (self.empty([rows, VOCAB], fill="0.0"), [rows, VOCAB], ["t", "v"]),
            lambda a: [
                *self.f16_lines(a[2], a[3], "%d"),
                f"%qf = arith.sitofp {a[1]} : i8 to f32",
                "%wv = arith.mulf %d, %qf : f32",
                f"%p = arith.mulf {a[0]}, %wv : f32",
                f"%r = arith.addf {a[4]}, %p : f32",
                "linalg.yield %r : f32",
            ],
        )

    def _q8_head(self, x, rows):
        """The LM head kernel of `logits` (rows None: x is [1, 576], the
        result [VOCAB]) and `logits_rows` (x [rows, 576], result [rows, VOCAB])."""
        r = self.HEAD_GROUP
        g = DIM // 32 // r
        wty = _global_type("Q8_0", (VOCAB, DIM))
        w = self.fresh("w")
        self.emit(f"{w} = util.global.load @{_sym('token_embd.weight')} : {wty}")
        we = self.fresh("w")
        wgty = f"tensor<{VOCAB}x{g}x{r}x34xi8>"
        self.emit(f"{we} = tensor.expand_shape {w} [[0], [1, 2], [3]] output_shape [{VOCAB}, {g}, {r}, 34] : {wty} into {wgty}")
        if rows is None:
            size, xty, xsty, xmap = "1", f"tensor<1x{DIM}xf32>", f"tensor<{g}x16xf32>", ["g", "j"]
        else:
            size = "%O" if rows == "O" else self.tsize()
            xty, xsty, xmap = self.ty([rows, DIM]), self.ty([rows, g, 16]), ["t", "g", "j"]
        xe = self.fresh("x")
        xety = self.ty([1 if rows is None else rows, g, r, 32])
        self.emit(f"{xe} = tensor.expand_shape {x} [[0], [1, 2, 3]] output_shape [{size}, {g}, {r}, 32] : {xty} into {xety}")
        xs, ws = [], []
        for k in range(r):
            for h in range(2):
                v = self.fresh("x")
                self.emit(f"{v} = tensor.extract_slice {xe}[0, 0, {k}, {16 * h}] [{size}, {g}, 1, 16] [1, 1, 1, 1] : {xety} to {xsty}")
                xs.append((v, xsty, xmap, "f32"))
            # Block bytes: the f16 scale (bytes 0, 1), then 32 int8 values.
            for off, sz in ((2, 16), (18, 16), (0, 1), (1, 1)):
                v = self.fresh("s")
                if sz == 1:
                    sty = f"tensor<{VOCAB}x{g}xi8>"
                    ws.append((v, sty, ["v", "g"], "i8"))
                else:
                    sty = f"tensor<{VOCAB}x{g}x16xi8>"
                    ws.append((v, sty, ["v", "g", "j"], "i8"))
                self.emit(
                    f"{v} = tensor.extract_slice {we}[0, 0, {k}, {off}] [{VOCAB}, {g}, 1, {sz}] [1, 1, 1, 1] : {wgty} to {sty}"
                )

        def body(a):
            lines, terms = [], []
            for k in range(r):
                x0, x1 = a[2 * k], a[2 * k + 1]
                q0, q1, dl, dh = a[2 * r + 4 * k : 2 * r + 4 * k + 4]
                lines += self.f16_lines(dl, dh, f"%d{k}")
                lines += [
                    f"%fa{k} = arith.sitofp {q0} : i8 to f32",
                    f"%fb{k} = arith.sitofp {q1} : i8 to f32",
                    f"%pa{k} = arith.mulf {x0}, %fa{k} : f32",
                    f"%pb{k} = arith.mulf {x1}, %fb{k} : f32",
                    f"%s{k} = arith.addf %pa{k}, %pb{k} : f32",
                    f"%t{k} = arith.mulf %s{k}, %d{k} : f32",
                ]
                terms.append(f"%t{k}")
            # A pairwise tree: independent adds, not one chain of r.
            n = 0
            while len(terms) > 1:
                nxt = []
                for i in range(0, len(terms) - 1, 2):
                    n += 1
                    lines.append(f"%u{n} = arith.addf {terms[i]}, {terms[i + 1]} : f32")
                    nxt.append(f"%u{n}")
                terms = nxt + terms[len(terms) - len(terms) % 2 :]
            return lines + [f"%r = arith.addf {a[-1]}, {terms[0]} : f32", "linalg.yield %r : f32"]

        if rows is None:
            dims, iters, out = ["v", "g", "j"], ["parallel", "reduction", "reduction"], ([VOCAB], ["v"])
        else:
            dims, iters, out = ["t", "v", "g", "j"], ["parallel", "parallel", "reduction", "reduction"], ([rows, VOCAB], ["t", "v"])
        return self.generic(dims, iters, xs + ws, (self.empty(out[0], fill="0.0"), out[0], out[1]), body)

    def forward(self, ids):
        """The whole model over ids [T] at positions pos..; returns the
        logits of the last token."""
        x = self.embed(ids)
        kvd = KV_HEADS * HEAD_DIM
        for i in range(LAYERS):
            p = f"blk.{i}."
            h = self.rmsnorm_lazy(x, p + "attn_norm.weight")
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
            h = self.rmsnorm_lazy(x, p + "ffn_norm.weight")
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
        if self.batched and self.out_rows is not None:
            # A step call: logits for the chosen rows only (a prompt's rows
            # but its last need none, and the logits kernel is about a fifth
            # of a 16-row step).
            xo = self.generic(
                ["o", "d"],
                ["parallel"] * 2,
                [(self.out_rows, self.ty(["O"], "i32"), ["o"], "i32")],
                (self.empty(["O", DIM]), ["O", DIM], ["o", "d"]),
                lambda a: [
                    f"%row = arith.index_cast {a[0]} : i32 to index",
                    "%d = linalg.index 1 : index",
                    f"%r = tensor.extract {x}[%row, %d] : {self.ty(['T', DIM])}",
                    "linalg.yield %r : f32",
                ],
            )
            n = self.rmsnorm(xo, "output_norm.weight", rows="O")
            return self.logits_rows(n, rows="O")
        if self.batched:
            # Every row is its own sequence: logits for all of them.
            n = self.rmsnorm(x, "output_norm.weight")
            return self.logits_rows(n)
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


# The cuda decode step attends to the first pos + 1 positions rounded up
# to a multiple of this (at most the capacity; the positions past pos are
# masked): its kernels' sizes then change once every ATTEND_ROUND steps
# rather than at every step (see Fn.device_pos).
ATTEND_ROUND = 64


def _checks(f, round_attended=False):
    """Position bookkeeping shared by both entry points: %pos (index), %L =
    pos + T (with `round_attended`, rounded up to ATTEND_ROUND positions,
    at most the capacity), and the capacity check."""
    f.emit("%pos = arith.index_cast %pos_i32 : i32 to index")
    f.emit("%one_idx = arith.constant 1 : index")
    L = "%Lexact" if round_attended else "%L"
    f.emit(f"{L} = arith.addi %pos, %T : index")
    f.emit("%zero_i32 = arith.constant 0 : i32")
    f.emit("%pos_ok = arith.cmpi sge, %pos_i32, %zero_i32 : i32")
    f.emit(f'cf.assert %pos_ok, "position must not be negative"')
    # The capacity is the cache's own dimension, so the check holds for
    # whatever init_cache allocated.
    f.emit(f"%kv0_cap = util.global.load @kv0 : {KV_TYPE}")
    f.emit("%cap = tensor.dim %kv0_cap, %one_idx : " + KV_TYPE)
    f.emit(f"%fits = arith.cmpi ule, {L}, %cap : index")
    f.emit('cf.assert %fits, "positions pass the KV cache capacity (context_length; init_cache sets it)"')
    f.emit("%has = arith.cmpi uge, %T, %one_idx : index")
    f.emit('cf.assert %has, "at least one token is needed"')
    if round_attended:
        f.emit(f"%round = arith.constant {ATTEND_ROUND} : index")
        f.emit(f"%round_m1 = arith.constant {ATTEND_ROUND - 1} : index")
        f.emit("%Lup0 = arith.addi %Lexact, %round_m1 : index")
        f.emit("%Lup1 = arith.divui %Lup0, %round : index")
        f.emit("%Lup = arith.muli %Lup1, %round : index")
        f.emit("%Lmin = arith.minui %Lup, %cap : index")
        # Hidden from the compiler's integer range analysis: knowing %L a
        # multiple of 64, the pinned compiler crashes lowering the softmax
        # kernels for cuda ("SmallVector unable to grow").
        f.emit("%L = util.optimization_barrier %Lmin : index")


# The CPU program's prefill runs the fused kernels (as decode) for prompts of
# at most this many tokens and multiplies dequantized copies (padded rows,
# matmul_rows_padded) beyond: making the 210 copies costs about as much as
# 3 tokens of fused kernels. Time to first token, local-sync, 2 loaded
# cores, fused / copies: 1 token 65 / 143 ms, 2 tokens 95 / 202 ms,
# 4 tokens 216 / 140 ms, 17 tokens 543 / 259 ms.
PREFILL_FUSED_MAX = 3


def _prefill_by_length(f):
    """The CPU prefill's forward pass in `f` (whose %T and checks are
    emitted): an `scf.if` on the prompt length choosing between the two
    formulations of the matrix products, both the same math."""
    small = f.fresh("c")
    f.emit("%c7_idx = arith.constant 7 : index")
    f.emit("%c8_idx = arith.constant 8 : index")
    f.emit("%T7 = arith.addi %T, %c7_idx : index")
    f.emit("%T8 = arith.divui %T7, %c8_idx : index")
    f.emit("%Tp = arith.muli %T8, %c8_idx : index")
    f.emit("%Tpad = arith.subi %Tp, %T : index")
    f.emit(f"%fused_max = arith.constant {PREFILL_FUSED_MAX} : index")
    f.emit(f"{small} = arith.cmpi ule, %T, %fused_max : index")
    r = f.fresh("r")
    f.emit(f"{r} = scf.if {small} -> (tensor<{VOCAB}xf32>) {{")
    for dequant_once in (False, True):
        if dequant_once:
            f.emit("} else {")
        g = Fn(None, dequant_once=dequant_once)
        g.pad_rows = dequant_once
        # Distinct SSA names in the two regions (readability of the MLIR).
        g.n = f.n + (1 if not dequant_once else 500000)
        x = g.forward("%ids")
        g.emit(f"scf.yield {x} : tensor<{VOCAB}xf32>")
        f.lines += ["  " + line for line in g.lines]
    f.emit("}")
    return r


def build_mlir(gpu=False):
    """The single-sequence program's MLIR. `gpu`: the cuda formulation of
    the matrix products (build_cuda.py; see matmul_q4_1_gpu and
    _q8_head_gpu), the same math; the CPU program is built with the
    default."""
    out = ["// Generated by examples/llm/model.py; do not edit.", "module @smollm2 {"]
    for name, kind, shape in weight_specs():
        out.append(
            f'  util.global private @{_sym(name)} = #stream.parameter.named<"model"::"{name}"> : {_global_type(kind, shape)}'
        )
    # Each layer's cache is filled with its own layer number: the values are
    # never read (attention reads positions < pos + T only, all written
    # first), but with one shared value the pinned compiler merged the
    # mutable globals into one (every layer then wrote the same cache: wrong
    # logits from the second position on). The initializer gives every
    # cache one position, so a program whose host never calls init_cache
    # fails the capacity check instead of reading an unset global.
    for i in range(LAYERS):
        out.append(f"  util.global private mutable @kv{i} : {KV_TYPE}")
    out.append("  util.initializer {")
    out.append("    %one = arith.constant 1 : index")
    out += _cache_fills("%one", "    ")
    out.append("    util.return")
    out.append("  }")
    out.append("  func.func @init_cache(%n_i32: i32) -> i32 {")
    out.append("    %lo = arith.constant 1 : i32")
    out.append(f"    %hi = arith.constant {MAX_CONTEXT} : i32")
    out.append("    %ok_lo = arith.cmpi sge, %n_i32, %lo : i32")
    out.append("    %ok_hi = arith.cmpi sle, %n_i32, %hi : i32")
    out.append("    %ok = arith.andi %ok_lo, %ok_hi : i1")
    out.append(f'    cf.assert %ok, "init_cache: the context must be 1..{MAX_CONTEXT} positions"')
    out.append("    %n = arith.index_cast %n_i32 : i32 to index")
    out += _cache_fills("%n", "    ")
    out.append("    return %n_i32 : i32")
    out.append("  }")

    f = Fn(None, gpu=gpu)
    f.emit("%dim0 = arith.constant 0 : index")
    f.emit("%T = tensor.dim %ids, %dim0 : tensor<?xi32>")
    _checks(f)
    if gpu:
        r = f.forward("%ids")
    else:
        r = _prefill_by_length(f)
    f.emit(f"return {r} : tensor<{VOCAB}xf32>")
    out.append(f"  func.func @prefill(%ids: tensor<?xi32>, %pos_i32: i32) -> tensor<{VOCAB}xf32> {{")
    out += f.lines
    out.append("  }")

    for greedy in (False, True) if gpu else (False,):
        out += _decode(gpu, greedy)

    out.append("  func.func @context_length() -> i32 {")
    out.append(f"    %kv = util.global.load @kv0 : {KV_TYPE}")
    out.append("    %one = arith.constant 1 : index")
    out.append(f"    %d = tensor.dim %kv, %one : {KV_TYPE}")
    out.append("    %c = arith.index_cast %d : index to i32")
    out.append("    return %c : i32")
    out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


# decode_greedy's argmax runs in two stages: ARGMAX_ROWS rows of
# VOCAB / ARGMAX_ROWS logits each, then the rows' maxima (one serial scan of
# 49,152 values is one GPU thread's work: tens of microseconds).
ARGMAX_ROWS = 192


def _argmax(f, logits):
    """Lines computing tensor<1xi32>: the first index of the largest of the
    `logits` (tensor<VOCAB x f32>), NaNs never chosen, 0 when no value is
    above -inf: `ferrite_llm::sampling::argmax`'s result, so the device's
    greedy ids are the host's. Each stage keeps the lower index on equal
    values, so the result does not depend on the order in which the
    compiler combines partial maxima."""
    rows, cols = ARGMAX_ROWS, VOCAB // ARGMAX_ROWS
    assert rows * cols == VOCAB
    n = f.fresh("am")

    f.emit(f"{n}_x = tensor.expand_shape {logits} [[0, 1]] output_shape [{rows}, {cols}] : tensor<{VOCAB}xf32> into tensor<{rows}x{cols}xf32>")
    f.emit(f"{n}_ninf = arith.constant 0xFF800000 : f32")
    f.emit(f"{n}_z = arith.constant 0 : i32")
    body = [
        "%gt = arith.cmpf ogt, %v, %m : f32",
        "%eq = arith.cmpf oeq, %v, %m : f32",
        "%lower = arith.cmpi slt, %vi, %i : i32",
        "%tie = arith.andi %eq, %lower : i1",
        "%take = arith.ori %gt, %tie : i1",
        "%nm = arith.select %take, %v, %m : f32",
        "%ni = arith.select %take, %vi, %i : i32",
        "linalg.yield %nm, %ni : f32, i32",
    ]
    # Stage 1: per row r, the first index (into the whole vector) of its
    # largest value.
    f.emit(f"{n}_me = tensor.empty() : tensor<{rows}xf32>")
    f.emit(f"{n}_m0 = linalg.fill ins({n}_ninf : f32) outs({n}_me : tensor<{rows}xf32>) -> tensor<{rows}xf32>")
    f.emit(f"{n}_ie = tensor.empty() : tensor<{rows}xi32>")
    f.emit(f"{n}_i0 = linalg.fill ins({n}_z : i32) outs({n}_ie : tensor<{rows}xi32>) -> tensor<{rows}xi32>")
    f.emit(
        f"{n}_r:2 = linalg.generic {{indexing_maps = [affine_map<(r, c) -> (r, c)>, affine_map<(r, c) -> (r)>, affine_map<(r, c) -> (r)>], "
        f'iterator_types = ["parallel", "reduction"]}} ins({n}_x : tensor<{rows}x{cols}xf32>) '
        f"outs({n}_m0, {n}_i0 : tensor<{rows}xf32>, tensor<{rows}xi32>) {{"
    )
    f.emit("^bb0(%v: f32, %m: f32, %i: i32):")
    for line in [
        "  %r = linalg.index 0 : index",
        "  %c = linalg.index 1 : index",
        f"  %cols = arith.constant {cols} : index",
        "  %base = arith.muli %r, %cols : index",
        "  %g = arith.addi %base, %c : index",
        "  %vi = arith.index_cast %g : index to i32",
    ] + ["  " + b for b in body]:
        f.emit(line)
    f.emit(f"}} -> (tensor<{rows}xf32>, tensor<{rows}xi32>)")
    # Stage 2: the rows' maxima, the lower index on ties.
    f.emit(f"{n}_se = tensor.empty() : tensor<f32>")
    f.emit(f"{n}_s0 = linalg.fill ins({n}_ninf : f32) outs({n}_se : tensor<f32>) -> tensor<f32>")
    f.emit(f"{n}_je = tensor.empty() : tensor<i32>")
    f.emit(f"{n}_j0 = linalg.fill ins({n}_z : i32) outs({n}_je : tensor<i32>) -> tensor<i32>")
    f.emit(
        f"{n}_s:2 = linalg.generic {{indexing_maps = [affine_map<(r) -> (r)>, affine_map<(r) -> (r)>, affine_map<(r) -> ()>, affine_map<(r) -> ()>], "
        f'iterator_types = ["reduction"]}} ins({n}_r#0, {n}_r#1 : tensor<{rows}xf32>, tensor<{rows}xi32>) '
        f"outs({n}_s0, {n}_j0 : tensor<f32>, tensor<i32>) {{"
    )
    f.emit("^bb0(%v: f32, %vi: i32, %m: f32, %i: i32):")
    for line in body:
        f.emit("  " + line)
    f.emit(f"}} -> (tensor<f32>, tensor<i32>)")
    f.emit(f"{n} = tensor.expand_shape {n}_s#1 [] output_shape [1] : tensor<i32> into tensor<1xi32>")
    return n


def _kv_indices_from(f, posv):
    """The cache write's indices [[0, pos], [1, pos]] (K, V) from the device
    position `posv` (tensor<1xi32>): tensor<2x2xi32>."""
    return f.generic(
        ["i", "j"],
        ["parallel"] * 2,
        [],
        (f.empty([2, 2], "i32"), [2, 2], ["i", "j"]),
        lambda a: [
            "%i = linalg.index 0 : index",
            "%j = linalg.index 1 : index",
            "%zero = arith.constant 0 : index",
            f"%p = tensor.extract {posv}[%zero] : tensor<1xi32>",
            "%is_which = arith.cmpi eq, %j, %zero : index",
            "%ii = arith.index_cast %i : index to i32",
            "%r = arith.select %is_which, %ii, %p : i32",
            "linalg.yield %r : i32",
        ],
        out_et="i32",
    )


def _decode(gpu, greedy):
    """The `decode` entry point's lines: append token `%tok_id` at position
    `%pos_i32` and return the next logits.

    `greedy` (the cuda program only): `decode_greedy` instead. It takes the
    step's state as a device tensor, `[token, position]` (tensor<2xi32>),
    and returns the next state, `[argmax of the logits (_argmax), position +
    1]`, so the device chains the steps; `%pos_i32` (the same position, from
    the host) gives only the capacity check and the attended length. It
    follows the coarse-fences model (`iree.abi.model`: a wait and a signal
    fence after its arguments; the call returns once its work is queued).
    A host queues step n + 1 on step n's result before step n has run and
    reads step n's token while the device runs step n + 1: the host's
    recording of a step overlaps the device's work instead of following it
    (ferrite_llm's pipelined greedy loop). No host wait may sit inside the
    step for that: the position comes in device memory rather than through
    `util.optimization_barrier` (a barrier on a tensor makes the pinned
    compiler wait on the host for the work before it)."""
    f = Fn(1, gpu=gpu)
    f.emit("%T = arith.constant 1 : index")
    _checks(f, round_attended=gpu)
    if greedy:
        f.device_pos = True
        # The device position, clamped below the attended length (at most
        # the capacity) whatever the state holds, so the cache write stays
        # in bounds; the token is clamped by the embedding (Fn.embed). A
        # host's first state is checked by the host (ferrite_llm).
        f.emit("%L_i32 = arith.index_cast %L : index to i32")
        f.emit("%state_c0 = arith.constant 0 : index")
        f.emit("%state_c1 = arith.constant 1 : index")
        posv = f.generic(
            ["i"],
            ["parallel"],
            [],
            (f.empty([1], "i32"), [1], ["i"]),
            lambda a: [
                "%c1 = arith.constant 1 : index",
                "%p = tensor.extract %state[%c1] : tensor<2xi32>",
                "%zero = arith.constant 0 : i32",
                "%one = arith.constant 1 : i32",
                "%top = arith.subi %L_i32, %one : i32",
                "%lo = arith.maxsi %p, %zero : i32",
                "%r = arith.minsi %lo, %top : i32",
                "linalg.yield %r : i32",
            ],
            out_et="i32",
        )
        f.emit(f"%posv = tensor.extract_slice {posv}[0] [1] [1] : tensor<1xi32> to tensor<1xi32>")
        f.emit("%ids = tensor.extract_slice %state[0] [1] [1] : tensor<2xi32> to tensor<1xi32>")
        f.emit(f"%kvidx = tensor.extract_slice {_kv_indices_from(f, '%posv')}[0, 0] [2, 2] [1, 1] : tensor<2x2xi32> to tensor<2x2xi32>")
        tok = _argmax(f, f.forward("%ids"))
        nxt = f.generic(
            ["i"],
            ["parallel"],
            [],
            (f.empty([2], "i32"), [2], ["i"]),
            lambda a: [
                "%i = linalg.index 0 : index",
                "%zero = arith.constant 0 : index",
                f"%t = tensor.extract {tok}[%zero] : tensor<1xi32>",
                "%p = tensor.extract %posv[%zero] : tensor<1xi32>",
                "%one = arith.constant 1 : i32",
                "%p1 = arith.addi %p, %one : i32",
                "%is_tok = arith.cmpi eq, %i, %zero : index",
                "%r = arith.select %is_tok, %t, %p1 : i32",
                "linalg.yield %r : i32",
            ],
            out_et="i32",
        )
        f.emit(f"util.return {nxt} : tensor<2xi32>")
        # A util.func: the pinned compiler drops `iree.abi.model` from a
        # func.func when it converts it.
        head = (
            "  util.func public @decode_greedy(%state: tensor<2xi32>, %pos_i32: i32) -> tensor<2xi32> "
            'attributes {iree.abi.model = "coarse-fences"} {'
        )
        return [head, *f.lines, "  }"]
    if gpu:
        # The position as a device tensor (the barrier keeps the compiler
        # from folding it back into every kernel as a constant) and the
        # cache write's indices from it.
        f.device_pos = True
        f.emit("%posd = tensor.from_elements %pos_i32 : tensor<1xi32>")
        f.emit("%posv = util.optimization_barrier %posd : tensor<1xi32>")
        f.emit(f"%kvidx = util.optimization_barrier {_kv_indices_from(f, '%posv')} : tensor<2x2xi32>")
    f.emit("%ids = tensor.from_elements %tok_id : tensor<1xi32>")
    f.emit("%id_ok0 = arith.cmpi sge, %tok_id, %zero_i32 : i32")
    f.emit(f"%vocab = arith.constant {VOCAB} : i32")
    f.emit("%id_ok1 = arith.cmpi slt, %tok_id, %vocab : i32")
    f.emit("%id_ok = arith.andi %id_ok0, %id_ok1 : i1")
    f.emit(f'cf.assert %id_ok, "token id out of range 0..{VOCAB}"')
    r = f.forward("%ids")
    f.emit(f"return {r} : tensor<{VOCAB}xf32>")
    return [f"  func.func @decode(%tok_id: i32, %pos_i32: i32) -> tensor<{VOCAB}xf32> {{", *f.lines, "  }"]


def _cache_fills(n, indent):
    """Lines storing a fresh [2, n, 3, 64] cache in every `@kv<layer>`."""
    lines = []
    for i in range(LAYERS):
        lines += [
            f"%kv_e{i} = tensor.empty({n}) : {KV_TYPE}",
            f"%kv_c{i} = arith.constant {float(i)} : f32",
            f"%kv_f{i} = linalg.fill ins(%kv_c{i} : f32) outs(%kv_e{i} : {KV_TYPE}) -> {KV_TYPE}",
            f"util.global.store %kv_f{i}, @kv{i} : {KV_TYPE}",
        ]
    return [indent + line for line in lines]


# ---------------------------------------------------------------- batch program
#
# The program for continuous batching (issue 29): SLOTS independent sequences,
# each with its own KV cache of SLOT_CONTEXT positions, in one mutable global
# per layer `@kv<layer>`: [SLOTS, SLOT_CONTEXT, 2 (K, V), 3, 64] f32.
#
#     prefill_slot(slot: i32, ids: tensor<?xi32>, pos: i32) -> tensor<VOCAB x f32>
#         the single program's prefill on one slot;
#     decode_batch(slots, toks, pos: tensor<?xi32>) -> tensor<? x VOCAB x f32>
#         one token for each of B sequences (1 <= B <= SLOTS): row b is
#         token toks[b] at position pos[b] of slot slots[b]; its K/V are
#         scattered into that slot and its attention reads that slot's
#         positions 0..pos[b] only, so rows never see each other;
#     decode_batch_wide(slots, toks, pos) -> tensor<? x VOCAB x f32>
#         the same results for many rows: each Q4_1 matrix is dequantized
#         to f32 once per call (its own dispatch) and multiplied with all
#         rows, where decode_batch's fused kernels dequantize it again for
#         every row (cheaper for a few rows, linear in them);
#     decode_slot(slot: i32, tok: i32, pos: i32) -> tensor<VOCAB x f32>
#         decode_batch for one row, with the single program's static
#         one-row kernels (hosts use it for a batch of one);
#     slots() -> i32, context_length() -> i32 (per slot),
#     wide_batch_min() -> i32: the row count from which hosts call
#         decode_batch_wide.
#
# Slot ids out of 0..SLOTS, a slot twice in one batch, positions past
# SLOT_CONTEXT and token ids outside the vocabulary fail with a clear error
# (`cf.assert`, checked on the host before any dispatch).

SLOTS = 16
SLOT_CONTEXT = 1024
# From this many rows on, the host calls decode_batch_wide (same results,
# the matrices dequantized once per call instead of once per row): upstream
# local-sync, 2 cores, 64-token contexts: 4 rows 140 vs 266 ms, 5 rows 196
# vs 184, 6 rows 292 vs 239, 7 rows 350 vs 280 (decode_batch vs wide).
WIDE_BATCH_MIN = 5
# The most rows of one step call (decode rows plus prompt rows). Each row
# gathers its slot's attended positions ([L, 2, 3, 64] f32 per layer), so
# the transient memory of a call grows with rows x L.
STEP_ROWS = 128
KVB_TYPE = f"tensor<{SLOTS}x{SLOT_CONTEXT}x2x{KV_HEADS}x{HEAD_DIM}xf32>"


def kv_bytes_batch():
    """Bytes of the batch program's KV caches (all layers and slots)."""
    return LAYERS * SLOTS * SLOT_CONTEXT * 2 * KV_HEADS * HEAD_DIM * 4


def _row_flags(f, bits):
    """A reduction over the T rows: `bits` (callable: the block arguments
    slot, position, token -> (lines, i32 value)) OR-ed over the rows into a
    0-d i32 tensor (computed on the device, read back with the others in
    one transfer by _read_flags)."""
    def body(a):
        lines, value = bits(a)
        return [*lines, f"%r = arith.ori {a[3]}, {value} : i32", "linalg.yield %r : i32"]

    return f.generic(
        ["t"],
        ["reduction"],
        [(v, f.ty(["T"], "i32"), ["t"], "i32") for v in ("%slotv", "%posv", "%toks")],
        (f.empty([], "i32", fill="0"), [], []),
        body,
        out_et="i32",
    )


# Bits of the rows' range flags (_range_bits).
BAD_SLOT, BAD_NEG_POS, BAD_CAP_POS, BAD_TOKEN = 1, 2, 4, 8


def _range_bits(a):
    """Lines computing one row's range flags (BAD_* bits) from its slot,
    position and token a[0], a[1], a[2]."""
    s, p, k = a[0], a[1], a[2]
    return [
        "%z = arith.constant 0 : i32",
        f"%ns = arith.constant {SLOTS} : i32",
        f"%cap = arith.constant {SLOT_CONTEXT} : i32",
        f"%nv = arith.constant {VOCAB} : i32",
        f"%s_lo = arith.cmpi sge, {s}, %z : i32",
        f"%s_hi = arith.cmpi slt, {s}, %ns : i32",
        "%s_ok = arith.andi %s_lo, %s_hi : i1",
        f"%p_lo = arith.cmpi sge, {p}, %z : i32",
        f"%p_hi = arith.cmpi slt, {p}, %cap : i32",
        f"%k_lo = arith.cmpi sge, {k}, %z : i32",
        f"%k_hi = arith.cmpi slt, {k}, %nv : i32",
        "%k_ok = arith.andi %k_lo, %k_hi : i1",
        f"%b1 = arith.constant {BAD_SLOT} : i32",
        f"%b2 = arith.constant {BAD_NEG_POS} : i32",
        f"%b4 = arith.constant {BAD_CAP_POS} : i32",
        f"%b8 = arith.constant {BAD_TOKEN} : i32",
        "%e1 = arith.select %s_ok, %z, %b1 : i32",
        "%e2 = arith.select %p_lo, %z, %b2 : i32",
        "%e4 = arith.select %p_hi, %z, %b4 : i32",
        "%e8 = arith.select %k_ok, %z, %b8 : i32",
        "%e12 = arith.ori %e1, %e2 : i32",
        "%e48 = arith.ori %e4, %e8 : i32",
        "%e = arith.ori %e12, %e48 : i32",
    ], "%e"


def _max_pos(f):
    """The rows' largest position (0-d i32; at least 0)."""
    return f.generic(
        ["t"],
        ["reduction"],
        [("%posv", f.ty(["T"], "i32"), ["t"], "i32")],
        (f.empty([], "i32", fill="0"), [], []),
        lambda a: [f"%r = arith.maxsi {a[1]}, {a[0]} : i32", "linalg.yield %r : i32"],
        out_et="i32",
    )


def _read_flags(f, flags):
    """Packs the 0-d i32 tensors `flags` into one tensor<N x i32> and reads
    it back to the host once, returning its N scalars. The checks then cost
    one transfer per call: a loop of tensor.extract per row made the
    compiler read each row back on its own (one device round trip per row,
    ~150 us each on cuda)."""
    n = len(flags)

    def body(a):
        lines, v = ["%c = linalg.index 0 : index"], a[n - 1]
        for i in range(n - 2, -1, -1):
            lines += [
                f"%i{i} = arith.constant {i} : index",
                f"%is{i} = arith.cmpi eq, %c, %i{i} : index",
                f"%v{i} = arith.select %is{i}, {a[i]}, {v} : i32",
            ]
            v = f"%v{i}"
        return lines + [f"linalg.yield {v} : i32"]

    packed = f.generic(
        ["c"],
        ["parallel"],
        [(v, "tensor<i32>", [], "i32") for v in flags],
        (f.empty([n], "i32"), [n], ["c"]),
        body,
        out_et="i32",
    )
    out = []
    for i in range(n):
        c = f.const(i, "index")
        v = f.fresh("flag")
        f.emit(f"{v} = tensor.extract {packed}[{c}] : tensor<{n}xi32>")
        out.append(v)
    return out


def _assert_range_bits(f, err):
    """The asserts of _range_bits' flags `err`, in the order of the
    per-row checks they replace."""
    for bit, msg in (
        (BAD_SLOT, f"slot id out of range 0..{SLOTS} (slots)"),
        (BAD_NEG_POS, "position must not be negative"),
        (BAD_CAP_POS, f"position past the KV cache capacity of {SLOT_CONTEXT} per slot (context_length)"),
        (BAD_TOKEN, f"token id out of range 0..{VOCAB}"),
    ):
        m = f.const(bit, "i32")
        h = f.fresh("chk")
        f.emit(f"{h} = arith.andi {err}, {m} : i32")
        ok = f.fresh("chk")
        f.emit(f"{ok} = arith.cmpi eq, {h}, %zero_i32 : i32")
        f.emit(f'cf.assert {ok}, "{msg}"')


def _refuse_unless(f, ok, asserts):
    """Branches on `ok` (i1: every check passed): on to the rest of the
    function, or to a block running `asserts` (callable emitting the
    cf.asserts in their order; one of them fails). The branch is what keeps
    the checks before the work: with the asserts inline, the compiler issued
    decode_batch's main command buffer once the largest position (for %L)
    was read back and ran the asserts after it, so a bad slot reached the KV
    cache's scatter and gather (a crash on local-task)."""
    f.emit(f"cf.cond_br {ok}, ^checked, ^refused")
    f.lines.append("  ^refused:")
    asserts()
    f.emit("cf.br ^checked")
    f.lines.append("  ^checked:")


def _max_to_L(f, mx):
    f.emit(f"%mxi = arith.index_cast {mx} : i32 to index")
    f.emit("%L = arith.addi %mxi, %one_idx : index")


def _batch_checks(f):
    """decode_batch's argument checks and bookkeeping: equal lengths, 1 <= B
    <= SLOTS, every slot, position and token in range, no slot twice; %L is
    the longest row's attended length (max pos + 1) and `f.kvidx` the
    [B, 2] (slot, position) scatter indices. The per-row conditions are
    reduced on the device and read back in one transfer (_read_flags)."""
    f.emit("%bz0 = arith.constant 0 : index")
    f.emit("%one_idx = arith.constant 1 : index")
    f.emit("%T = tensor.dim %slotv, %bz0 : tensor<?xi32>")
    f.emit("%T_toks = tensor.dim %toks, %bz0 : tensor<?xi32>")
    f.emit("%T_pos = tensor.dim %posv, %bz0 : tensor<?xi32>")
    f.emit("%same1 = arith.cmpi eq, %T, %T_toks : index")
    f.emit("%same2 = arith.cmpi eq, %T, %T_pos : index")
    f.emit("%same = arith.andi %same1, %same2 : i1")
    f.emit('cf.assert %same, "slots, toks and pos must have the same length"')
    f.emit("%has = arith.cmpi uge, %T, %one_idx : index")
    f.emit('cf.assert %has, "at least one sequence is needed"')
    f.emit(f"%nslots = arith.constant {SLOTS} : index")
    f.emit("%fits_b = arith.cmpi ule, %T, %nslots : index")
    f.emit(f'cf.assert %fits_b, "more sequences than the {SLOTS} slots"')
    f.emit("%zero_i32 = arith.constant 0 : i32")
    err = _row_flags(f, _range_bits)
    # No slot twice: the OR and the sum of 1 << slot over the rows differ
    # exactly when a slot repeats (slots in range, at most SLOTS rows: the
    # sum stays below 2^20).

    def slot_bit(a):
        return [
            "%m31 = arith.constant 31 : i32",
            f"%sm = arith.andi {a[0]}, %m31 : i32",
            "%one = arith.constant 1 : i32",
            "%bit = arith.shli %one, %sm : i32",
        ], "%bit"

    seen = _row_flags(f, slot_bit)
    total = f.generic(
        ["t"],
        ["reduction"],
        [("%slotv", f.ty(["T"], "i32"), ["t"], "i32")],
        (f.empty([], "i32", fill="0"), [], []),
        lambda a: [*slot_bit(a)[0], f"%r = arith.addi {a[1]}, %bit : i32", "linalg.yield %r : i32"],
        out_et="i32",
    )
    e, s, t, mx = _read_flags(f, [err, seen, total, _max_pos(f)])
    f.emit(f"%fresh = arith.cmpi eq, {s}, {t} : i32")
    f.emit(f"%in_range = arith.cmpi eq, {e}, %zero_i32 : i32")
    f.emit("%all_ok = arith.andi %in_range, %fresh : i1")

    def asserts():
        _assert_range_bits(f, e)
        f.emit('cf.assert %fresh, "a slot appears twice in one decode_batch"')

    _refuse_unless(f, "%all_ok", asserts)
    _max_to_L(f, mx)
    _kv_indices(f)


def _kv_indices(f):
    """decode_batch's and step's scatter indices `f.kvidx` ([T, 2]: slot,
    position per row) and gather indices `f.slot_index` ([T, 1]: slot)."""
    idx = f.generic(
        ["t", "c"],
        ["parallel", "parallel"],
        [("%slotv", f.ty(["T"], "i32"), ["t"], "i32"), ("%posv", f.ty(["T"], "i32"), ["t"], "i32")],
        (f.empty(["T", 2], "i32"), ["T", 2], ["t", "c"]),
        lambda a: [
            "%c = linalg.index 1 : index",
            "%z = arith.constant 0 : index",
            "%is0 = arith.cmpi eq, %c, %z : index",
            f"%r = arith.select %is0, {a[0]}, {a[1]} : i32",
            "linalg.yield %r : i32",
        ],
        out_et="i32",
    )
    f.kvidx = idx
    f.slot_index = "%slot_index"
    f.emit(f"%slot_index = tensor.expand_shape %slotv [[0, 1]] output_shape [%T, 1] : {f.ty(['T'], 'i32')} into {f.ty(['T', 1], 'i32')}")


def _pairs_flag(f, v1, v2, size, bad):
    """A 0-d i32 tensor: 1 when `bad` (callable: the block arguments of rows
    b - 1 and b of the vectors v1, v2 (tensor<?xi32> of `size` rows, size
    at least 1): previous v1, current v1, previous v2, current v2 -> (lines,
    i1)) holds for some b >= 1, else 0."""
    # size - 1 pairs, clamped at 0: the compiler may compute this before
    # the host's assert that size >= 1 (it moved "out must name 1 to T
    # rows" after the flags' readback).
    m1 = f.fresh("n")
    f.emit(f"{m1} = arith.maxui {size}, %one_idx : index")
    m = f.fresh("n")
    f.emit(f"{m} = arith.subi {m1}, %one_idx : index")
    ins = []
    for v in v1, v2:
        for lo in (0, 1):
            s = f.fresh("s")
            f.emit(f"{s} = tensor.extract_slice {v}[{lo}] [{m}] [1] : tensor<?xi32> to tensor<?xi32>")
            ins.append((s, "tensor<?xi32>", ["t"], "i32"))

    def body(a):
        lines, cond = bad(a)
        return lines + [
            "%one = arith.constant 1 : i32",
            "%zero = arith.constant 0 : i32",
            f"%e = arith.select {cond}, %one, %zero : i32",
            f"%r = arith.ori {a[4]}, %e : i32",
            "linalg.yield %r : i32",
        ]

    return f.generic(["t"], ["reduction"], ins, (f.empty([], "i32", fill="0"), [], []), body, out_et="i32")


def _step_checks(f):
    """step's argument checks and bookkeeping: rows sorted by (slot,
    position) with no pair twice (several rows of one slot are one prompt's
    tokens: each sees its own slot's positions up to its own, those written
    by the rows before it in the same call included), 1 <= T <= STEP_ROWS,
    every slot, position and token in range; `%outv` names 1 <= O <= T
    rows, strictly increasing, whose logits are returned. The per-row
    conditions are reduced on the device and read back in one transfer
    (_read_flags)."""
    f.emit("%bz0 = arith.constant 0 : index")
    f.emit("%one_idx = arith.constant 1 : index")
    f.emit("%T = tensor.dim %slotv, %bz0 : tensor<?xi32>")
    f.emit("%T_toks = tensor.dim %toks, %bz0 : tensor<?xi32>")
    f.emit("%T_pos = tensor.dim %posv, %bz0 : tensor<?xi32>")
    f.emit("%same1 = arith.cmpi eq, %T, %T_toks : index")
    f.emit("%same2 = arith.cmpi eq, %T, %T_pos : index")
    f.emit("%same = arith.andi %same1, %same2 : i1")
    f.emit('cf.assert %same, "slots, toks and pos must have the same length"')
    f.emit("%has = arith.cmpi uge, %T, %one_idx : index")
    f.emit('cf.assert %has, "at least one row is needed"')
    f.emit(f"%nrows = arith.constant {STEP_ROWS} : index")
    f.emit("%fits_b = arith.cmpi ule, %T, %nrows : index")
    f.emit(f'cf.assert %fits_b, "more than {STEP_ROWS} rows in one step"')
    f.emit("%zero_i32 = arith.constant 0 : i32")
    # Checked before the flags are computed (they slice O - 1 rows of out),
    # as the row checks are independent of them.
    f.emit("%O = tensor.dim %outv, %bz0 : tensor<?xi32>")
    f.emit("%o_has = arith.cmpi uge, %O, %one_idx : index")
    f.emit("%o_fits = arith.cmpi ule, %O, %T : index")
    f.emit("%o_ok = arith.andi %o_has, %o_fits : i1")
    f.emit('cf.assert %o_ok, "out must name 1 to T rows"')
    f.emit("%T_i32 = arith.index_cast %T : index to i32")
    err = _row_flags(f, _range_bits)

    def unordered(a):
        sp, sc, pp, pc = a[:4]
        return [
            f"%s_gt = arith.cmpi sgt, {sc}, {sp} : i32",
            f"%s_eq = arith.cmpi eq, {sc}, {sp} : i32",
            f"%p_gt = arith.cmpi sgt, {pc}, {pp} : i32",
            "%same_later = arith.andi %s_eq, %p_gt : i1",
            "%ordered = arith.ori %s_gt, %same_later : i1",
            "%true = arith.constant true",
            "%bad = arith.xori %ordered, %true : i1",
        ], "%bad"

    order = _pairs_flag(f, "%slotv", "%posv", "%T", unordered)

    def out_range(a):
        return [
            "%z = arith.constant 0 : i32",
            f"%o_lo = arith.cmpi sge, {a[0]}, %z : i32",
            f"%o_hi = arith.cmpi slt, {a[0]}, %T_i32 : i32",
            "%o_in = arith.andi %o_lo, %o_hi : i1",
            "%one = arith.constant 1 : i32",
            "%e = arith.select %o_in, %z, %one : i32",
        ], "%e"

    oin = f.generic(
        ["o"],
        ["reduction"],
        [("%outv", "tensor<?xi32>", ["o"], "i32")],
        (f.empty([], "i32", fill="0"), [], []),
        lambda a: [*out_range(a)[0], f"%r = arith.ori {a[1]}, %e : i32", "linalg.yield %r : i32"],
        out_et="i32",
    )

    def out_order(a):
        return [f"%o_le = arith.cmpi sle, {a[1]}, {a[0]} : i32"], "%o_le"

    ord_out = _pairs_flag(f, "%outv", "%outv", "%O", out_order)
    e, o, mx, oi, oo = _read_flags(f, [err, order, _max_pos(f), oin, ord_out])
    f.emit(f"%ordered = arith.cmpi eq, {o}, %zero_i32 : i32")
    f.emit(f"%o_all = arith.ori {oi}, {oo} : i32")
    f.emit("%o_good = arith.cmpi eq, %o_all, %zero_i32 : i32")
    f.emit(f"%in_range = arith.cmpi eq, {e}, %zero_i32 : i32")
    f.emit("%rows_ok = arith.andi %in_range, %ordered : i1")
    f.emit("%all_ok = arith.andi %rows_ok, %o_good : i1")

    def asserts():
        _assert_range_bits(f, e)
        f.emit('cf.assert %ordered, "step rows must be sorted by (slot, position), no pair twice"')
        f.emit('cf.assert %o_good, "out rows must be increasing row indices below T"')

    _refuse_unless(f, "%all_ok", asserts)
    _max_to_L(f, mx)
    _kv_indices(f)
    f.out_rows = "%outv"


def _slot_checks(f):
    """prefill_slot's and decode_slot's checks: slot in range, positions
    pos..pos+T within the slot, at least one token."""
    f.emit("%pos = arith.index_cast %pos_i32 : i32 to index")
    f.emit("%slot = arith.index_cast %slot_i32 : i32 to index")
    f.emit("%one_idx = arith.constant 1 : index")
    f.emit("%L = arith.addi %pos, %T : index")
    f.emit("%zero_i32 = arith.constant 0 : i32")
    f.emit(f"%slots_i32 = arith.constant {SLOTS} : i32")
    f.emit("%s_lo = arith.cmpi sge, %slot_i32, %zero_i32 : i32")
    f.emit("%s_hi = arith.cmpi slt, %slot_i32, %slots_i32 : i32")
    f.emit("%s_ok = arith.andi %s_lo, %s_hi : i1")
    f.emit(f'cf.assert %s_ok, "slot id out of range 0..{SLOTS} (slots)"')
    f.emit("%pos_ok = arith.cmpi sge, %pos_i32, %zero_i32 : i32")
    f.emit('cf.assert %pos_ok, "position must not be negative"')
    f.emit(f"%cap = arith.constant {SLOT_CONTEXT} : index")
    f.emit("%fits = arith.cmpi ule, %L, %cap : index")
    f.emit(f'cf.assert %fits, "positions pass the KV cache capacity of {SLOT_CONTEXT} per slot (context_length)"')
    f.emit("%has = arith.cmpi uge, %T, %one_idx : index")
    f.emit('cf.assert %has, "at least one token is needed"')


def build_batch_mlir(gpu=False):
    """The batch program's MLIR. gpu=True: the cuda formulation
    (examples/llm/build_cuda.py --batch): the same math and entry points,
    decode_slot and prefill_slot as the single cuda program's decode and
    prefill, decode_batch and step with one-row kernels per row given
    compilation configs of ours (matmul_q4_1_gpu_rows, _q8_head_gpu_rows),
    decode_batch_wide and step_wide calling them and wide_batch_min past
    step_rows (the dequantize-once f32 matmuls are slower on a GPU)."""
    out = ["// Generated by examples/llm/model.py (batch program); do not edit.", "module @smollm2_batch {"]
    for name, kind, shape in weight_specs():
        out.append(
            f'  util.global private @{_sym(name)} = #stream.parameter.named<"model"::"{name}"> : {_global_type(kind, shape)}'
        )
    # Distinct initial values per layer, as in build_mlir (the compiler
    # merges mutable globals with one shared initial value).
    for i in range(LAYERS):
        out.append(f"  util.global private mutable @kv{i} : {KVB_TYPE} = dense<{float(i)}> : {KVB_TYPE}")

    f = Fn(None, "slot", gpu=gpu)
    f.emit("%dim0 = arith.constant 0 : index")
    f.emit("%T = tensor.dim %ids, %dim0 : tensor<?xi32>")
    _slot_checks(f)
    r = f.forward("%ids")
    f.emit(f"return {r} : tensor<{VOCAB}xf32>")
    out.append(f"  func.func @prefill_slot(%slot_i32: i32, %ids: tensor<?xi32>, %pos_i32: i32) -> tensor<{VOCAB}xf32> {{")
    out += f.lines
    out.append("  }")

    # One sequence's step with the single program's static one-row kernels
    # (hosts call it for a batch of one: decode_batch's dynamic-row kernels
    # cost more for one row).
    f = Fn(1, "slot", gpu=gpu)
    f.emit("%T = arith.constant 1 : index")
    _slot_checks(f)
    f.emit("%ids = tensor.from_elements %tok_id : tensor<1xi32>")
    f.emit("%id_ok0 = arith.cmpi sge, %tok_id, %zero_i32 : i32")
    f.emit(f"%vocab = arith.constant {VOCAB} : i32")
    f.emit("%id_ok1 = arith.cmpi slt, %tok_id, %vocab : i32")
    f.emit("%id_ok = arith.andi %id_ok0, %id_ok1 : i1")
    f.emit(f'cf.assert %id_ok, "token id out of range 0..{VOCAB}"')
    r = f.forward("%ids")
    f.emit(f"return {r} : tensor<{VOCAB}xf32>")
    out.append(f"  func.func @decode_slot(%slot_i32: i32, %tok_id: i32, %pos_i32: i32) -> tensor<{VOCAB}xf32> {{")
    out += f.lines
    out.append("  }")

    f = Fn(None, "batch", gpu=gpu, dequant_once=False)
    _batch_checks(f)
    r = f.forward("%toks")
    f.emit(f"return {r} : tensor<?x{VOCAB}xf32>")
    out.append(
        f"  func.func @decode_batch(%slotv: tensor<?xi32>, %toks: tensor<?xi32>, %posv: tensor<?xi32>) -> tensor<?x{VOCAB}xf32> {{"
    )
    out += f.lines
    out.append("  }")

    vec = "tensor<?xi32>"
    res = f"tensor<?x{VOCAB}xf32>"
    if gpu:
        # Same kernels: hosts never pick these (wide_batch_min), but a host
        # that does gets decode_batch's results.
        out.append(f"  func.func @decode_batch_wide(%slotv: {vec}, %toks: {vec}, %posv: {vec}) -> {res} {{")
        out.append(f"    %r = func.call @decode_batch(%slotv, %toks, %posv) : ({vec}, {vec}, {vec}) -> {res}")
        out.append(f"    return %r : {res}")
        out.append("  }")
    else:
        f = Fn(None, "wide")
        _batch_checks(f)
        r = f.forward("%toks")
        f.emit(f"return {r} : {res}")
        out.append(f"  func.func @decode_batch_wide(%slotv: {vec}, %toks: {vec}, %posv: {vec}) -> {res} {{")
        out += f.lines
        out.append("  }")

    for name, mode in (("step", "batch"), ("step_wide", "wide")):
        args = f"%slotv: {vec}, %toks: {vec}, %posv: {vec}, %outv: {vec}"
        if gpu and mode == "wide":
            out.append(f"  func.func @{name}({args}) -> {res} {{")
            out.append(f"    %r = func.call @step(%slotv, %toks, %posv, %outv) : ({vec}, {vec}, {vec}, {vec}) -> {res}")
            out.append(f"    return %r : {res}")
            out.append("  }")
            continue
        f = Fn(None, mode, gpu=gpu, dequant_once=False if gpu else None)
        _step_checks(f)
        r = f.forward("%toks")
        f.emit(f"return {r} : {res}")
        out.append(f"  func.func @{name}({args}) -> {res} {{")
        out += f.lines
        out.append("  }")

    for name, value in (
        ("slots", SLOTS),
        ("context_length", SLOT_CONTEXT),
        ("wide_batch_min", STEP_ROWS + 1 if gpu else WIDE_BATCH_MIN),
        ("step_rows", STEP_ROWS),
    ):
        out.append(f"  func.func @{name}() -> i32 {{")
        out.append(f"    %c = arith.constant {value} : i32")
        out.append("    return %c : i32")
        out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    import sys

    gpu = "--gpu" in sys.argv[1:]
    sys.stdout.write(build_batch_mlir(gpu) if "--batch" in sys.argv[1:] else build_mlir(gpu))
