"""FunctionInvoker on its Python path: contexts and functions that are not our
native objects (anything with `invoke` / a `reflection` dict), the legacy
`iree.abi` JSON reflection, and dynamic mode (no reflection). Calls are
driven through a recording context, and the same calls are made through the
pinned upstream runtime where it is installed."""

import importlib
import json

import numpy as np
import pytest

import ferrite.runtime as frt
from ferrite.runtime import function as ffn


def _upstream():
    try:
        return importlib.import_module("iree.runtime")
    except ImportError:
        return None


UPSTREAM = _upstream()
LIBS = ["ferrite"] + (["upstream"] if UPSTREAM is not None else [])


class Lib:
    """One runtime (ours or upstream's) with a device to call on."""

    def __init__(self, name):
        self.name = name
        self.rt = frt if name == "ferrite" else UPSTREAM
        self.function = importlib.import_module(self.rt.__name__ + ".function")
        self.device = self.rt.Config("local-task").device

    def List(self, capacity=1):
        return self.rt._binding.VmVariantList(capacity)

    def view(self, array, element_type):
        return self.device.allocator.allocate_buffer_copy(
            memory_type=self.function.IMPLICIT_BUFFER_ARG_MEMORY_TYPE,
            allowed_usage=self.function.IMPLICIT_BUFFER_ARG_USAGE,
            device=self.device,
            buffer=np.asarray(array),
            element_type=element_type,
        )

    def invoker(self, abi=None, results=None, reflection=None):
        """An invoker over a recording context; `results(lib, ret_list)`
        fills the result list; `abi` is the `iree.abi` dict (None: dynamic)."""
        if reflection is None:
            reflection = {} if abi is None else {"iree.abi": json.dumps(abi)}
        context = RecordingContext(lambda ret_list: results and results(self, ret_list))
        return context, self.function.FunctionInvoker(context, self.device, FakeFunction(reflection))


class RecordingContext:
    """A context known only by its `invoke`; keeps every argument list."""

    def __init__(self, fill_results):
        self.fill_results = fill_results
        self.calls = []

    def invoke(self, vm_function, arg_list, ret_list):
        self.calls.append((vm_function, arg_list))
        self.fill_results(ret_list)

    @property
    def last_args(self):
        return repr(self.calls[-1][1])


class FakeFunction:
    def __init__(self, reflection):
        self.reflection = reflection

    def __repr__(self):
        return "<FakeFunction>"


@pytest.fixture(scope="module", params=LIBS)
def lib(request):
    return Lib(request.param)


@pytest.fixture(scope="module")
def ours():
    return Lib("ferrite")


def abi(args, results=()):
    return {"a": list(args), "r": list(results), "v": 1}


def ints(*values):
    def fill(lib, ret_list):
        for v in values:
            ret_list.push_int(v)
    return fill


# --- Which invoker -----------------------------------------------------------


def test_native_objects_without_legacy_reflection_take_the_native_path(compile_program):
    m = frt.load_vm_flatbuffer_file(str(compile_program("invoker")), driver="local-sync")
    inv = m.add
    assert type(inv).__module__ == "ferrite._ferrite"
    assert isinstance(inv, ffn.FunctionInvoker)
    direct = ffn.FunctionInvoker(m._context.vm_context, m._context.config.device, inv.vm_function)
    assert type(direct) is type(inv)


def test_duck_typed_objects_take_the_python_path(ours):
    ctx, inv = ours.invoker()
    assert type(inv) is ffn.ReflectionInvoker
    assert isinstance(inv, ffn.FunctionInvoker)
    assert repr(inv) == "<FakeFunction>"
    assert isinstance(inv.vm_function, FakeFunction)
    assert not ctx.calls


def test_legacy_reflection_takes_the_python_path_on_native_objects(compile_program):
    m = frt.load_vm_flatbuffer_file(str(compile_program("legacy_abi")), driver="local-sync")
    assert type(m.add) is ffn.ReflectionInvoker
    assert m.add.vm_function.name == "add"


def test_error_classes():
    assert issubclass(ffn.ArgumentError, ValueError)
    assert issubclass(ffn.ReturnError, ValueError)


# --- Differential: the same calls through both runtimes ------------------------

I32_2 = ["ndarray", "i32", 1, 2]

# (abi or None, results filler, positional args, kwargs, expected arg-list repr,
#  expected result)
CALLS = {
    "dynamic_scalars": (None, ints(3, 4), (1, 2), {}, "<VmVariantList(2): [1, 2]>", (3, 4)),
    "dynamic_float": (None, ints(1), (2.5,), {}, "<VmVariantList(1): [2.500000]>", 1),
    "dynamic_list": (None, ints(1), ([2, 3],), {}, "<VmVariantList(1): [List[2, 3]]>", 1),
    "dynamic_nested": (None, None, ((1, (2.5, [3])),), {},
                       "<VmVariantList(1): [List[1, List[2.500000, List[3]]]]>", None),
    "dynamic_dict_sorted": (None, None, ({"b": 3, "a": [2]},), {},
                            "<VmVariantList(1): [List[List[2], 3]]>", None),
    "dynamic_ndarray": (None, None, (np.asarray([1, 0], np.int32),), {},
                        "<VmVariantList(1): [HalBufferView(2:0x20000011)]>", None),
    "dynamic_numpy_scalar": (None, None, (np.float32(2.5),), {},
                             "<VmVariantList(1): [HalBufferView(:0x20000021)]>", None),
    "dynamic_f16": (None, None, (np.zeros(3, np.float16),), {},
                    "<VmVariantList(1): [HalBufferView(3:0x10000021)]>", None),
    "kwargs": (abi(["i32", ["named", "a", "i32"], ["named", "b", "i32"]], ["i32"]), ints(3),
               (-1,), {"b": 2, "a": 1}, "<VmVariantList(3): [-1, 1, 2]>", 3),
    "positional_for_named": (abi(["i32", ["named", "a", "i32"]], ["i32"]), ints(3),
                             (-1,), {"a": 5}, "<VmVariantList(2): [-1, 5]>", 3),
    "scalars": (abi(["i8", "i16", "i32", "i64", "f32", "f64"], []), None,
                (-3, 300, True, 2**40, 3, np.float32(1.5)), {},
                "<VmVariantList(6): [-3, 300, 1, 1099511627776, 3.000000, 1.500000]>", None),
    "slist": (abi([["slist", "i32", "i32"]], ["i32"]), ints(3), ([2, 3],), {},
              "<VmVariantList(1): [List[2, 3]]>", 3),
    "stuple": (abi([["stuple", "i32", "f32"]]), None, ((2, 3),), {},
               "<VmVariantList(1): [List[2, 3.000000]]>", None),
    "sdict": (abi([["sdict", ["a", "i32"], ["b", "i32"]]]), None, ({"b": 3, "a": 2},), {},
              "<VmVariantList(1): [List[2, 3]]>", None),
    "nested_structs": (abi([["slist", ["sdict", ["k", I32_2]], ["stuple", "f64"]]]), None,
                       ([{"k": [1, 2]}, (0.5,)],), {},
                       "<VmVariantList(1): [List[List[HalBufferView(2:0x20000011)], List[0.500000]]]>", None),
    "ndarray_from_list": (abi([I32_2]), None, ([1, 0],), {},
                          "<VmVariantList(1): [HalBufferView(2:0x20000011)]>", None),
    "ndarray_casts_dtype": (abi([["ndarray", "f32", 1, 2]]), None, (np.asarray([1, 2], np.int64),), {},
                            "<VmVariantList(1): [HalBufferView(2:0x20000021)]>", None),
    "ndarray_0d_from_scalar": (abi([["ndarray", "f32", 0]]), None, (2.5,), {},
                               "<VmVariantList(1): [HalBufferView(:0x20000021)]>", None),
    "ndarray_i1": (abi([["ndarray", "i1", 1, 2]]), None, ([1, 0],), {},
                   "<VmVariantList(1): [HalBufferView(2:0x08000013)]>", None),
    "ndarray_i8_i16_i64_f64": (abi([["ndarray", t, 1, 1] for t in ("i8", "i16", "i64", "f64")]), None,
                               ([1], [1], [1], [1]), {},
                               "<VmVariantList(4): [HalBufferView(1:0x08000011), HalBufferView(1:0x10000011), "
                               "HalBufferView(1:0x40000011), HalBufferView(1:0x40000021)]>", None),
    "no_results": (abi([], []), None, (), {}, "<VmVariantList(0): []>", None),
}


@pytest.mark.parametrize("case", sorted(CALLS))
def test_calls(lib, case):
    desc, results, args, kwargs, arg_repr, expected = CALLS[case]
    ctx, inv = lib.invoker(desc, results)
    assert inv(*args, **kwargs) == expected
    assert ctx.last_args == arg_repr
    assert len(ctx.calls) == 1


def _device_value(lib, array, element_type):
    def fill(l, ret_list):
        ret_list.push_ref(l.view(np.asarray(array), getattr(l.rt.HalElementType, element_type)))
    return fill


def test_bfloat16_array_in_dynamic_mode(lib):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ctx, inv = lib.invoker()
    inv(np.arange(4, dtype=ml_dtypes.bfloat16).reshape(2, 2))
    assert ctx.last_args == "<VmVariantList(1): [HalBufferView(2x2:0x10000022)]>"


def test_device_array_and_buffer_view_pass_as_they_are(lib):
    # No host transfer is allowed on this array: packing must not need one.
    arr = lib.rt.asdevicearray(lib.device, np.asarray([1, 0], np.int32), implicit_host_transfer=False)
    bv = lib.view(np.asarray([1, 0], np.int32), lib.rt.HalElementType.SINT_32)
    for desc in (None, abi([I32_2])):
        ctx, inv = lib.invoker(desc)
        inv(arr)
        assert ctx.calls[-1][1].get_as_object(0, lib.rt.HalBufferView).__repr__() == bv.__repr__()
        inv(bv)
        assert ctx.last_args == "<VmVariantList(1): [HalBufferView(2:0x20000011)]>"


def test_ndarray_results(lib):
    fill = _device_value(lib, np.asarray([1.5, 2.0], np.float32), "FLOAT_32")
    for desc, dtype, values in [
        (None, np.float32, [1.5, 2.0]),
        (abi([], [["ndarray", "f32", 1, 2]]), np.float32, [1.5, 2.0]),
        # The descriptor's element type converts the values.
        (abi([], [["ndarray", "i32", 1, 2]]), np.int32, [1, 2]),
    ]:
        _, inv = lib.invoker(desc, fill)
        result = inv()
        assert type(result).__name__ == "DeviceArray"
        assert result.dtype == dtype
        np.testing.assert_array_equal(result.to_host(), values)


def test_bool_ndarray_result(lib):
    fill = _device_value(lib, np.asarray([1, 0], np.int8), "UINT_8")
    _, inv = lib.invoker(abi([], [["ndarray", "i1", 1, 2]]), fill)
    result = inv()
    assert result.dtype == np.bool_
    np.testing.assert_array_equal(result, [True, False])


def _nested(lib, ret_list):
    ret_list.push_int(3)
    outer, inner = lib.List(2), lib.List(2)
    inner.push_int(100)
    inner.push_float(0.5)
    outer.push_list(inner)
    outer.push_int(6)
    ret_list.push_list(outer)


@pytest.mark.parametrize("results,expected", [
    (["i32", ["slist", ["sdict", ["b", "i32"], ["a", "f32"]], "i64"]], (3, [{"b": 100, "a": 0.5}, 6])),
    (["i64", ["stuple", ["slist", "i8", "f64"], "i16"]], (3, ([100, 0.5], 6))),
    (["i32", ["py_homogeneous_list", "i64"]], None),  # items of mixed kinds: an error
])
def test_structured_results(lib, results, expected):
    _, inv = lib.invoker(abi([], results), _nested)
    if expected is None:
        # (the first item is a list: upstream shows it as a VmRef, ours as a VmVariantList)
        with pytest.raises(ValueError, match="expected an <class 'int'> value but got <class '"):
            inv()
    else:
        assert inv() == expected


def test_homogeneous_list_result(lib):
    def fill(l, ret_list):
        items = l.List(3)
        for v in (1, 2, 3):
            items.push_int(v)
        ret_list.push_list(items)
    _, inv = lib.invoker(abi([], [["py_homogeneous_list", "i64"]]), fill)
    assert inv() == [1, 2, 3]


@pytest.mark.parametrize("kind,expected", [
    (["slist", "i32", "f32"], [1, 2.0]),
    (["stuple", "i32", "f32"], (1, 2.0)),
    (["sdict", ["k", "i32"], ["j", "f32"]], {"k": 1, "j": 2.0}),
])
def test_inlined_results(lib, kind, expected):
    # A lone slist/stuple/sdict result stands for the function's own results.
    def fill(l, ret_list):
        ret_list.push_int(1)
        ret_list.push_float(2.0)
    _, inv = lib.invoker(abi([], [kind]), fill)
    assert inv() == expected


def test_scalar_results(lib):
    def fill(l, ret_list):
        ret_list.push_int(7)
        ret_list.push_float(0.25)
    _, inv = lib.invoker(abi([], ["i16", "f64"]), fill)
    assert inv() == (7, 0.25)
    _, inv = lib.invoker(None, fill)
    assert inv() == (7, 0.25)


# Error texts upstream gives; ours contain them (argument errors also name
# the argument and its descriptor).
ERRORS = {
    "slist_arity": (abi([["slist", "i32", "i32"]]), ([2, 3, 4],), {}, "expected a sequence with 2 values. got: [2, 3, 4]"),
    "sdict_arity": (abi([["sdict", ["a", "i32"], ["b", "i32"]]]), ({"a": 2, "b": 3, "c": 4},), {},
                    "expected a dict with 2 values. got: {'a': 2, 'b': 3, 'c': 4}"),
    "sdict_key": (abi([["sdict", ["a", "i32"], ["b", "i32"]]]), ({"a": 2, "c": 3},), {},
                  "could not get item 'b' from: {'a': 2, 'c': 3}: "),
    "sdict_from_list": (abi([["sdict", ["a", "i32"]]]), ([1],), {}, "could not get item 'a' from: [1]: "),
    "too_many_positional": (abi(["i32", ["named", "a", "i32"]]), (1, 2), {}, "mismatched call arity: expected 1 got 2"),
    "missing_positional": (abi(["i32", ["named", "a", "i32"], ["named", "b", "i32"]]), (), {"a": 1, "b": 1},
                           "mismatched call arity: expected a value for argument 0"),
    "missing_keyword": (abi(["i32", ["named", "a", "i32"], ["named", "b", "i32"]]), (-1,), {"a": 1},
                        "mismatched call arity: expected a value for argument 2"),
    "missing_keyword_ndarray": (abi([I32_2, ["named", "a", I32_2], ["named", "b", I32_2]]), (-1,), {"a": 1},
                                "mismatched call arity:"),
    "unknown_keyword": (abi(["i32", ["named", "a", "i32"]]), (-1,), {"a": 1, "c": 3}, "specified kwarg 'c' is unknown"),
    "dynamic_kwargs": (None, (), {"a": 1}, "kwargs not supported for dynamic dispatch functions"),
    "dynamic_bool": (None, (True,), {}, "could not convert python value to VM: True"),
    "dynamic_none": (None, (None,), {}, "could not convert python value to VM: None"),
    "dynamic_str": (None, ("s",), {}, "could not convert python value to VM: 's'"),
    "dynamic_nested_none": (None, ([1, None],), {}, "could not convert python value to VM: None"),
    "ndarray_unconvertible": (abi([["ndarray", "f32", 1, 2]]), ("abc",), {},
                              "could not convert value to numpy array: dtype=<class 'numpy.float32'>, "
                              "error='could not convert string to float: 'abc'', value='abc'"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_argument_errors(lib, case):
    desc, args, kwargs, text = ERRORS[case]
    ctx, inv = lib.invoker(desc)
    with pytest.raises(ValueError) as e:
        inv(*args, **kwargs)
    assert text in str(e.value)
    assert not ctx.calls
    if lib.name == "ferrite":
        assert isinstance(e.value, ffn.ArgumentError)


@pytest.mark.parametrize("desc,text", [
    ([["bogus"]], "Unrecognized reflection compound type: bogus"),
    ([["py_homogeneous_list", "i32"]], "Unrecognized reflection compound type: py_homogeneous_list"),
    (["i1"], "Unrecognized reflection primitive type: i1"),
    (["bf16"], "Unrecognized reflection primitive type: bf16"),
    ([["ndarray", "u8", 1, 2]], "could not map abi type 'u8' to numpy dtype"),
    ([["ndarray", "f16", 1, 2]], "could not map abi type 'f16' to numpy dtype"),
])
def test_unsupported_argument_descriptors(lib, desc, text):
    with pytest.raises(ValueError, match=text):
        lib.invoker(abi(desc))


@pytest.mark.parametrize("reflection,text", [
    ({"iree.abi": "{"}, "Reflection metadata is not valid JSON: {"),
    ({"iree.abi": "{}"}, "Malformed function reflection metadata: {'iree.abi': '{}'}"),
    ({"iree.abi": '{"a": 1, "r": []}'}, "Malformed function reflection metadata structure"),
])
def test_malformed_reflection(lib, reflection, text):
    with pytest.raises(RuntimeError) as e:
        lib.invoker(reflection=reflection)
    assert text in str(e.value)


RETURN_ERRORS = {
    "float_for_int": (["i64"], lambda l, r: r.push_float(2.5),
                      "expected an <class 'int'> value but got <class 'float'>"),
    "int_for_float": (["f32"], lambda l, r: r.push_int(3),
                      "expected an <class 'float'> value but got <class 'int'>"),
    "arity": (["i32", "i32"], lambda l, r: r.push_int(3),
              "Error processing function return: mismatched return arity: 1 vs 2 (while decoding return )"),
    "no_descs": ([], lambda l, r: r.push_int(3),
                 "Error processing function return: mismatched return arity: 1 vs 0"),
    "unknown_type": (["weird"], lambda l, r: r.push_int(3),
                     "Error processing function return: cannot map VM type to Python: weird "
                     "(while decoding return 0@<VmVariantList(1): [3]> with description weird)"),
    "ndarray_from_int": ([["ndarray", "f32", 1, 2]], lambda l, r: r.push_int(3),
                         "Error processing function return: exception converting from VM type to Python "
                         "(while decoding return 0@<VmVariantList(1): [3]> with description ['ndarray', 'f32', 1, 2])"),
    "unknown_dtype": ([["ndarray", "zz", 1, 2]],
                      lambda l, r: r.push_ref(l.view(np.zeros(2, np.float32), l.rt.HalElementType.FLOAT_32)),
                      "Error processing function return: unrecognized dtype 'zz' (while decoding return "
                      "0@<VmVariantList(1): [HalBufferView(2:0x20000021)]> with description ['ndarray', 'zz', 1, 2])"),
}


@pytest.mark.parametrize("case", sorted(RETURN_ERRORS))
def test_return_errors(lib, case):
    results, fill, text = RETURN_ERRORS[case]
    _, inv = lib.invoker(abi([], results), fill)
    with pytest.raises(lib.function.ReturnError) as e:
        inv()
    assert text in str(e.value)


# --- Ours only: where we differ from upstream on purpose ----------------------


@pytest.mark.parametrize("desc,value,text", [
    ("i32", 2**40, "value 1099511627776 out of range for i32"),
    ("i8", 300, "value 300 out of range for i8"),
    ("i64", 2**70, f"value {2**70} out of range for i64"),
    ("i32", 1.5, "expected an integer for i32, got 1.5"),
    ("i32", "x", "expected an integer for i32, got 'x'"),
    ("f32", "x", "expected a number for f32, got 'x'"),
])
def test_scalar_conversion_errors_name_the_argument(ours, desc, value, text):
    # Upstream fails these with a bare `RuntimeError: std::bad_cast`.
    _, inv = ours.invoker(abi([desc]))
    with pytest.raises(ffn.ArgumentError) as e:
        inv(value)
    assert str(e.value) == (f"Error passing argument: {text} "
                            f"(while encoding argument {repr(value)!r} with description {desc})")


def test_argument_error_shows_arrays_by_shape_and_dtype(ours):
    _, inv = ours.invoker(abi([["slist", "i32"]]))
    with pytest.raises(ffn.ArgumentError) as e:
        inv(np.zeros((2, 3), np.float32))
    assert "(while encoding argument 'ndarray((2, 3), float32)' with description ['slist', 'i32'])" in str(e.value)


def test_dynamic_list_result_is_a_list(ours):
    # Upstream hands back an opaque VmRef here; ours gives the list itself.
    def fill(l, ret_list):
        items = l.List(2)
        items.push_int(1)
        items.push_int(2)
        ret_list.push_list(items)
    _, inv = ours.invoker(None, fill)
    result = inv()
    assert repr(result) == "<VmVariantList(2): [1, 2]>"


def test_arrays_are_copied_to_the_device(ours):
    host = np.arange(4, dtype=np.float32)
    ctx, inv = ours.invoker(abi([["ndarray", "f32", 1, 4]]))
    inv(host)
    view = ctx.calls[-1][1].get_as_object(0, frt.HalBufferView)
    host[:] = 0
    np.testing.assert_array_equal(
        frt.DeviceArray(ours.device, view, implicit_host_transfer=True).to_host(), [0, 1, 2, 3])


# --- A compiled program with legacy reflection, on both runtimes ---------------


@pytest.fixture(scope="module")
def legacy_vmfb(compile_program):
    return str(compile_program("legacy_abi"))


@pytest.mark.parametrize("driver", ["local-sync", "local-task"])
def test_compiled_legacy_program(lib, legacy_vmfb, driver):
    m = lib.rt.load_vm_flatbuffer_file(legacy_vmfb, driver=driver)
    a = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(m.add(a, b=a + 1), [1, 3, 5, 7])
    np.testing.assert_array_equal(m.add([1, 2, 3, 4], b=[1, 1, 1, 1]), [2, 3, 4, 5])
    with pytest.raises(ValueError, match="mismatched call arity: expected 1 got 2"):
        m.add(a, a)  # `b` is keyword-only
    assert m.scalars(3, 5) == (6, 2.5)
    x, y = m.unpair({"y": 7, "x": [4, 5]})
    assert y == 7 and x.dtype == np.int32
    np.testing.assert_array_equal(x, [4, 5])
    flags = m.flag(np.array([1, 0, 2], np.int8))
    assert flags.dtype == np.bool_
    np.testing.assert_array_equal(flags, [True, False, True])
    with pytest.raises(ValueError, match="specified kwarg 'c' is unknown"):
        m.add(a, c=a)
    with pytest.raises(ValueError, match="expected a dict with 2 values"):
        m.unpair({"x": [1, 2]})


# --- The packer on its own, under upstream's names ----------------------------


@pytest.mark.parametrize("descs,args,kwargs,expected", [
    (None, (1, [2.5, {"b": 1, "a": 2}]), {}, "<VmVariantList(2): [1, List[2.500000, List[2, 1]]]>"),
    (["i32", ["named", "k", "f32"]], (1,), {"k": 2}, "<VmVariantList(2): [1, 2.000000]>"),
    ([["stuple", "i64", ["ndarray", "f32", 0]]], ((7, 1.0),), {},
     "<VmVariantList(1): [List[7, HalBufferView(:0x20000021)]]>"),
])
def test_argument_packer(lib, descs, args, kwargs, expected):
    b = lib.rt._binding
    packer = b.ArgumentPacker(b._invoke_statics, descs)
    assert repr(packer.pack(b.InvokeContext(lib.device), args, kwargs)) == expected
