"""PyModuleInterface: VM modules written in Python, called from compiled programs.

Each scenario runs on ferrite.runtime and, where installed, on the pinned
iree.runtime, and both must agree.
"""

import gc

import numpy as np
import pytest

import ferrite.runtime as frt


@pytest.fixture(params=["ferrite", "upstream"])
def rt(request):
    if request.param == "ferrite":
        return frt
    return pytest.importorskip("iree.runtime")


def _pymod(rt, log):
    class State:
        def __init__(self, iface):
            self.iface = iface
            self.calls = 0

        def add_one(self, a):
            self.calls += 1
            log.append(("add_one", a, self.calls))
            return a + 1

        def scale(self, x, n):
            return x * 2.0, n * 3

        def fail(self, a):
            raise ValueError(f"boom {a}")

        def echo(self, view_ref):
            log.append(("echo", type(view_ref).__name__))
            return view_ref

    iface = rt.PyModuleInterface("pymod", State)
    iface.export("add_one", "0i_i", State.add_one)
    iface.export("scale", "0fI_fI", State.scale)
    iface.export("fail", "0i_i", State.fail)
    iface.export("echo", "0r_r", State.echo)
    return iface


def _context(rt, compile_program, iface):
    instance = rt.VmInstance()
    device = rt.get_driver("local-sync").create_default_device()
    hal = rt.create_hal_module(instance, device)
    program = rt.VmModule.mmap(instance, str(compile_program("pymodule_imports")))
    pymod = iface.create()
    context = rt.VmContext(instance, modules=(hal, pymod, program))
    return context, program, device


def _call(rt, context, program, name, *push):
    args = rt.VmVariantList(len(push))
    for kind, value in push:
        getattr(args, f"push_{kind}")(value)
    results = rt.VmVariantList(2)
    context.invoke(program.lookup_function(name), args, results)
    return results


def test_bytecode_calls_python_functions(rt, compile_program):
    log = []
    iface = _pymod(rt, log)
    context, program, _ = _context(rt, compile_program, iface)
    assert iface.initialized and not iface.destroyed

    r = _call(rt, context, program, "square_of_next", ("int", 6))
    assert r.get_variant(0) == 49
    r = _call(rt, context, program, "square_of_next", ("int", -3))
    assert r.get_variant(0) == 4
    # One state object per context, kept across calls.
    assert log == [("add_one", 6, 1), ("add_one", -3, 2)]

    r = _call(rt, context, program, "scaled", ("float", 1.25), ("int", 7))
    assert r.get_variant(0) == pytest.approx(2.5)
    assert r.get_variant(1) == 21


def test_python_exception_fails_the_invocation(rt, compile_program):
    iface = _pymod(rt, [])
    context, program, _ = _context(rt, compile_program, iface)
    with pytest.raises(RuntimeError, match="ValueError: boom 5"):
        _call(rt, context, program, "failing", ("int", 5))


def test_refs_pass_through_python(rt, compile_program):
    log = []
    iface = _pymod(rt, log)
    context, program, device = _context(rt, compile_program, iface)
    x = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    view = device.allocator.allocate_buffer_copy(
        memory_type=rt.MemoryType.DEVICE_LOCAL,
        allowed_usage=rt.BufferUsage.DEFAULT,
        device=device,
        buffer=x,
        element_type=rt.HalElementType.FLOAT_32,
    )
    args = rt.VmVariantList(1)
    args.push_ref(view)
    results = rt.VmVariantList(1)
    context.invoke(program.lookup_function("double_echo"), args, results)
    out = results.get_as_object(0, rt.HalBufferView)
    got = out.map().asarray((4,), np.dtype(np.float32))
    np.testing.assert_array_equal(got, x * 2)
    assert log == [("echo", "VmRef")]


def test_ctor_runs_per_context_and_module_is_released():
    calls = []
    iface = frt.PyModuleInterface("counted", lambda i: calls.append(i))
    assert not iface.initialized
    m = iface.create()
    instance = frt.VmInstance()
    c1 = frt.VmContext(instance, modules=(m,))
    c2 = frt.VmContext(instance, modules=(m,))
    assert len(calls) == 2 and calls[0] is iface
    assert "initialized" in str(iface)
    c1 = c2 = m = None
    gc.collect()
    assert iface.destroyed
    assert "destroyed" in str(iface)


def test_results_and_arguments_by_calling_convention():
    seen = []

    class S:
        def __init__(self, iface):
            pass

        def take(self, a, b):
            seen.append((a, b))

        def give(self):
            return seen_results

    iface = frt.PyModuleInterface("m", S)
    iface.export("take_f", "0ff", S.take)
    iface.export("take_I", "0II_v", S.take)
    iface.export("give_i", "0v_ii", S.give)
    iface.export("give_r", "0v_r", S.give)
    m = iface.create()
    ctx = frt.VmContext(frt.VmInstance(), modules=(m,))

    args = frt.VmVariantList(2)
    args.push_float(2.5)
    args.push_float(-1.0)
    ctx.invoke(m.lookup_function("take_f"), args, frt.VmVariantList(0))
    args = frt.VmVariantList(2)
    args.push_int(1 << 40)
    args.push_int(-2)
    ctx.invoke(m.lookup_function("take_I"), args, frt.VmVariantList(0))
    assert seen == [(2.5, -1.0), (1 << 40, -2)]

    seen_results = (4, 5)
    out = frt.VmVariantList(2)
    ctx.invoke(m.lookup_function("give_i"), frt.VmVariantList(0), out)
    assert repr(out) == "<VmVariantList(2): [4, 5]>"

    lst = frt.VmVariantList(1)
    lst.push_int(42)
    seen_results = lst.ref
    out = frt.VmVariantList(1)
    ctx.invoke(m.lookup_function("give_r"), frt.VmVariantList(0), out)
    assert repr(out) == "<VmVariantList(1): [List[42]]>"

    # Wrong result shapes and types fail the call with a clear message.
    seen_results = None
    with pytest.raises(RuntimeError, match="expected ref returned from Python function but got None"):
        ctx.invoke(m.lookup_function("give_r"), frt.VmVariantList(0), frt.VmVariantList(1))
    seen_results = (1,)
    with pytest.raises(ValueError, match="returned 1 results, its calling convention declares 2"):
        ctx.invoke(m.lookup_function("give_i"), frt.VmVariantList(0), frt.VmVariantList(2))
    seen_results = ("x", 1)
    with pytest.raises(ValueError, match="result 0: expected i32"):
        ctx.invoke(m.lookup_function("give_i"), frt.VmVariantList(0), frt.VmVariantList(2))


def test_export_errors():
    iface = frt.PyModuleInterface("m", lambda i: None)
    iface.export("f", "0i_i", lambda s, a: a)
    with pytest.raises(ValueError, match="already defined: f"):
        iface.export("f", "0i_i", lambda s, a: a)
    with pytest.raises(ValueError, match="variadic"):
        iface.export("g", "0CiD_i", lambda s, a: a)
    with pytest.raises(ValueError, match="Unparsable calling convention"):
        iface.export("h", "0q_i", lambda s, a: a)
    iface.create()
    with pytest.raises(RuntimeError, match="frozen"):
        iface.export("late", "0i_i", lambda s, a: a)
    with pytest.raises(RuntimeError, match="frozen"):
        iface.create()


def test_ctor_exception_fails_context_creation():
    def ctor(iface):
        raise KeyError("no state")

    m = frt.PyModuleInterface("bad", ctor).create()
    with pytest.raises(RuntimeError, match="Exception in call to PyModule constructor: KeyError"):
        frt.VmContext(frt.VmInstance(), modules=(m,))
