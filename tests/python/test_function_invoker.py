"""FunctionInvoker: argument checks, structured values, zero-copy inputs and
results, side by side with the pinned upstream runtime."""

import re

import numpy as np
import pytest

import ferrite.runtime as frt

DRIVERS = ["local-sync", "local-task"]


@pytest.fixture(scope="module")
def invoker_vmfb(compile_program):
    return str(compile_program("invoker"))


@pytest.fixture(scope="module", params=DRIVERS)
def both(request, invoker_vmfb, upstream):
    """(ours, upstream's) bound modules of `invoker.mlir` on one driver."""
    d = request.param
    return (frt.load_vm_flatbuffer_file(invoker_vmfb, driver=d),
            upstream.load_vm_flatbuffer_file(invoker_vmfb, driver=d))


def aligned(shape, dtype, offset=0):
    """A C-contiguous array whose data starts `offset` bytes past a 64-byte
    boundary (device buffers must be 64-byte aligned to be imported)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.zeros(n + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    return raw[start:start + n].view(dtype).reshape(shape)


def host(v):
    if isinstance(v, (tuple, list)):
        return type(v)(host(x) for x in v)
    return v.to_host() if hasattr(v, "to_host") else v


def errors(call):
    with pytest.raises(ValueError) as e:
        call()
    return str(e.value)


def upstream_core(message):
    """The status text of an upstream failure, without source locations and
    the trailing `while invoking ...` context."""
    m = re.search(r"INVALID_ARGUMENT; (.*?)(; while invoking|$)", message)
    assert m, message
    return m.group(1)


F32x4 = np.arange(4, dtype=np.float32)


@pytest.mark.parametrize("args", [
    (F32x4.reshape(2, 2), F32x4),                # rank
    (F32x4.astype(np.int32), F32x4),             # element type
    (np.arange(5, dtype=np.float32), F32x4),     # dimension
    (F32x4, np.zeros((4, 1), np.float32)),       # rank, second argument
    (F32x4,),                                    # too few
    (F32x4, F32x4, F32x4),                       # too many
], ids=["rank", "dtype", "dim", "rank-input1", "too-few", "too-many"])
def test_argument_errors_match_upstream(both, args):
    ours, theirs = both
    want = upstream_core(errors(lambda: theirs.add(*args)))
    got = errors(lambda: ours.add(*args))
    assert got.startswith("Error invoking function: INVALID_ARGUMENT; " + want), got
    if len(args) == 2:
        # Ours also says what the argument was declared as.
        assert "is declared tensor<4xf32>)" in got


def test_argument_error_texts(both):
    ours, _ = both
    assert errors(lambda: ours.add(F32x4.reshape(2, 2), F32x4)) == (
        "Error invoking function: INVALID_ARGUMENT; input0 shape rank mismatch; expected 1 but have 2; "
        "expected shape `4`, actual shape `2x2` (input0 is declared tensor<4xf32>)")
    assert errors(lambda: ours.add(F32x4, F32x4.astype(np.float64))) == (
        "Error invoking function: INVALID_ARGUMENT; input1 element type mismatch; expected f32 (21000020) "
        "but have f64 (21000040) (input1 is declared tensor<4xf32>)")
    # Dynamic dimensions are not checked; static ones are, by index.
    assert errors(lambda: ours.scale(np.zeros((2, 4), np.int32), 2)) == (
        "Error invoking function: INVALID_ARGUMENT; input0 shape dimension 1 mismatch; expected 3 but have 4; "
        "expected shape `?x3`, actual shape `2x4` (input0 is declared tensor<?x3xi32>)")
    # Kinds upstream only notices deep in the program (or not at all).
    assert errors(lambda: ours.add([1, 2, 3, 4], F32x4)) == (
        "input0 is declared tensor<4xf32> but received list [1, 2, 3, 4]")
    assert errors(lambda: ours.add(1.5, F32x4)) == "input0 is declared tensor<4xf32> but received float 1.5"
    assert errors(lambda: ours.scalars(2.5, 1.0)) == "input0 is declared i32 but received float 2.5"
    assert errors(lambda: ours.scalars(F32x4, 1.0)) == (
        "input0 is declared i32 but received ndarray((4,), float32)")
    assert errors(lambda: ours.add(F32x4.astype(">f4"), F32x4)).startswith(
        "input0: could not map dtype dtype('>f4') to element type")


def test_unconvertible_and_kwargs_messages_match_upstream(both):
    ours, theirs = both
    want = errors(lambda: theirs.echo_list("x"))
    assert errors(lambda: ours.echo_list("x")) == "input0: " + want
    assert errors(lambda: ours.add(F32x4, b=F32x4)) == errors(lambda: theirs.add(F32x4, b=F32x4))


def test_results_match_upstream(both):
    ours, theirs = both
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    m = rng.integers(-50, 50, (5, 3)).astype(np.int32)
    v = rng.standard_normal(1000).astype(np.float32)
    calls = [
        ("add", (a, b)),
        ("add", (np.arange(8, dtype=np.float32)[::2], b)),   # strided: copied dense
        ("add", (aligned(4, np.float32, offset=4) + 1, b)),  # unaligned: copied
        ("scale", (m, 3)),
        ("scale", (m.astype(np.uint32), 2)),  # a signless i32 takes either sign
        ("sum", (v,)),
        ("scalars", (7, 1.5)),
        ("scalars", (-3, 3.0)),
        ("echo", (np.arange(6, dtype=np.float32).reshape(2, 3),)),
    ]
    for name, args in calls:
        got, want = host(getattr(ours, name)(*args)), host(getattr(theirs, name)(*args))
        if isinstance(want, tuple):
            assert got == want, name
            assert [type(x) for x in got] == [type(x) for x in want], name
        else:
            assert got.dtype == want.dtype and got.shape == want.shape, name
            np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=name)


def test_numpy_scalars_are_scalars(both):
    # Upstream fails on these ("variant at index 1 is not a value type").
    ours, _ = both
    m = np.arange(6, dtype=np.int32).reshape(2, 3)
    np.testing.assert_array_equal(ours.scale(m, np.int32(-2)).to_host(), -2 * m)
    assert ours.scalars(np.int64(4), np.float32(0.5)) == (8, 0.25)
    assert ours.scalars(np.int8(1), np.float64(2)) == (2, 4.0)
    # Bools are not integers (upstream refuses Python's bool; numpy's too).
    with pytest.raises(ValueError, match="input0: could not convert python value to VM: np.True_"):
        ours.scalars(np.bool_(True), np.float64(2))
    # An int for a float argument is converted (upstream passes its bits as 0.0).
    assert ours.scalars(1, 3) == (2, 9.0)


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn"])
def test_ml_dtypes_arrays(both, name):
    # Arrays whose dtype has no buffer-protocol format (ml_dtypes) go in by
    # their bytes, typed by the dtype; strided ones are copied dense first.
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.array([1.5, -2, 3, 0.25], getattr(ml_dtypes, "bfloat16"))
    for m in both:
        np.testing.assert_array_equal(m.echo_bf16(a).to_host(), a)
        np.testing.assert_array_equal(m.echo_bf16(a[::2]).to_host(), a[::2])
    if name != "bfloat16":
        # (Upstream passes these through unchecked.)
        other = np.zeros(2, getattr(ml_dtypes, name))
        assert "input0 element type mismatch; expected bf16" in errors(lambda: both[0].echo_bf16(other))


def test_results_are_device_arrays_and_chain(both):
    ours, _ = both
    r = ours.add(F32x4, F32x4)
    assert isinstance(r, frt.DeviceArray)
    assert repr(r) == "<IREE DeviceArray: shape=[4], dtype=float32>"
    # A DeviceArray (and a plain buffer view) goes back in without the host.
    r2 = ours.add(r, r._buffer_view)
    np.testing.assert_array_equal(r2.to_host(), 4 * F32x4)
    assert ours.add(r, r).to_host().tolist() == [0.0, 4.0, 8.0, 12.0]
    with pytest.raises(ValueError, match="input0 shape rank mismatch"):
        ours.add(ours.echo(np.zeros((2, 2), np.float32)), F32x4)


def test_structured_arguments(both, upstream):
    ours, theirs = both
    value = [F32x4, 1, [2.5, (3, 4)], {"b": 5, "a": 6}]
    got = ours.echo_list(value)
    assert isinstance(got[0], frt.DeviceArray)
    np.testing.assert_array_equal(got[0].to_host(), F32x4)
    # Tuples are lists and dicts their values in key order, as upstream packs them.
    assert got[1:] == [1, [2.5, [3, 4]], [6, 5]]
    # Upstream returns the list as a ref; its contents are in the same order.
    want = theirs.echo_list({"b": 5, "a": 6}).deref(upstream.VmVariantList)
    assert str(want) == "<VmVariantList(2): [6, 5]>"
    assert ours.echo_list({"b": 5, "a": 6}) == [6, 5]


@pytest.mark.parametrize("driver", DRIVERS)
def test_aligned_input_is_not_copied(invoker_vmfb, driver):
    m = frt.load_vm_flatbuffer_file(invoker_vmfb, driver=driver)
    x = aligned((3, 5), np.float32)
    x[:] = np.arange(15, dtype=np.float32).reshape(3, 5)
    out = m.echo(x).to_host()
    # The identity's result is the input's buffer: the array's own memory.
    assert out.ctypes.data == x.ctypes.data
    # Imported as the writable memory it is (kernels may write any binding),
    # never borrowed by Rust as a slice.
    assert out.flags.writeable
    x[0, 0] = 42.0
    assert out[0, 0] == 42.0
    # Computations over imported inputs are right.
    assert m.sum(aligned(64, np.float32) + 0.5).to_host() == 32.0


@pytest.mark.parametrize("driver", DRIVERS)
def test_unaligned_or_strided_input_is_copied(invoker_vmfb, driver):
    m = frt.load_vm_flatbuffer_file(invoker_vmfb, driver=driver)
    x = aligned((3, 5), np.float32, offset=4)
    out = m.echo(x).to_host()
    assert out.ctypes.data != x.ctypes.data
    np.testing.assert_array_equal(out, x)
    big = aligned((3, 10), np.float32)
    big[:] = np.arange(30).reshape(3, 10)
    out = m.echo(big[:, ::2]).to_host()
    np.testing.assert_array_equal(out, big[:, ::2])


def test_read_only_and_output_arguments_are_copied(both):
    ours, theirs = both
    x = aligned((2, 3), np.float32)
    x[:] = 2.0
    x.setflags(write=False)
    out = ours.echo(x).to_host()
    assert out.ctypes.data != x.ctypes.data  # never let a program write it
    np.testing.assert_array_equal(out, x)
    # An iree.abi.output argument is storage the program writes; upstream
    # copies it, so the caller's array stays as it was.
    a = np.arange(4, dtype=np.float32)
    for m in (ours, theirs):
        dest = aligned(4, np.float32)
        got = m.add_into(a, dest).to_host()
        np.testing.assert_array_equal(got, 2 * a)
        np.testing.assert_array_equal(dest, np.zeros(4, np.float32))


def test_imported_input_outlives_caller_reference(invoker_vmfb):
    m = frt.load_vm_flatbuffer_file(invoker_vmfb, driver="local-task")
    x = aligned((2, 2), np.float32)
    x[:] = 3.0
    r = m.echo(x)
    del x  # the result's buffer keeps the numpy memory alive
    np.testing.assert_array_equal(r.to_host(), np.full((2, 2), 3.0, np.float32))


def test_invoker_api(invoker_vmfb, upstream):
    m = frt.load_vm_flatbuffer_file(invoker_vmfb, driver="local-sync")
    inv = m.add
    assert isinstance(inv, frt.FunctionInvoker)
    assert inv.vm_function.name == "add"
    assert repr(inv) == repr(inv.vm_function)
    direct = frt.FunctionInvoker(m._context.vm_context, m._context.config.device, inv.vm_function)
    np.testing.assert_array_equal(direct(F32x4, F32x4).to_host(), 2 * F32x4)
