#!/usr/bin/env python3
"""Runs self-checking test modules (IREE's `check` dialect, e.g. upstream's
e2e suites) under a Python runtime package, with the `check` module written
in Python, so that a runtime without a native check tool (the pinned
upstream wheel ships no `iree-check-module`) evaluates the same checks as
`ferrite check-module`.

Each exported function of a module that takes no arguments and returns
nothing is a test, as for `ferrite check-module` (names starting with `__`
or holding `$` are internal). A test passes when it returns and no
expectation failed. Expectations follow the `check` module's contract
(`crates/ferrite-modules/src/check.rs`): `expect_eq` compares shapes,
element types and bytes; `expect_almost_eq` accepts
`lhs == rhs || both NaN || (isfinite(rhs) && |lhs - rhs| <= atol + rtol*|rhs|)`
in float64.

Usage: scripts/check-with-python.py --runtime iree|ferrite --device D M.vmfb...
Prints `[ OK ]`/`[ FAILED ]` per test, then per suite (the module's parent
folder) `suite: N passed, M failed (modules: ...)` (a module passes when
all its tests do) and a last line `N passed, M failed` over all tests;
exits 1 when a test failed or a module could not be loaded.
"""
import argparse
import importlib
import os
import re
import sys
import time
from collections import defaultdict

import numpy as np


def bf16_to_f32(raw):
    """bf16 bit patterns (numpy has no bf16) widened to float32."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def make_check_module(rt, device, failures):
    """A `check` module whose expectations append messages to failures;
    buffer views are read through `device` (the context's device: a
    `!hal.device` argument cannot be dereferenced from Python)."""

    def host(_device_ref, view_ref):
        view = view_ref.deref(rt.HalBufferView)
        arr = rt.DeviceArray(device, view).to_host()
        return view, np.asarray(arr)

    def as_f64(view, arr):
        et = int(view.element_type)
        if et == int(rt.HalElementType.BFLOAT_16):
            return bf16_to_f32(arr.view(np.uint16)).astype(np.float64)
        return arr.astype(np.float64)

    class Check:
        def __init__(self, iface):
            pass

        def expect_true(self, v):
            if v == 0:
                failures.append(f"expected true, got {v}")

        def expect_false(self, v):
            if v != 0:
                failures.append(f"expected false, got {v}")

        def expect_all_true(self, device, view):
            _, a = host(device, view)
            if not np.all(a.view(np.uint8) if a.dtype == np.bool_ else a != 0):
                failures.append(f"expected all true, got {a.ravel()[:16]}")

        def expect_eq(self, device, lhs, rhs):
            lv, la = host(device, lhs)
            rv, ra = host(device, rhs)
            if list(lv.shape) != list(rv.shape) or int(lv.element_type) != int(rv.element_type):
                failures.append(f"shape/type mismatch: {list(lv.shape)} vs {list(rv.shape)}")
            elif la.tobytes() != ra.tobytes():
                failures.append("contents differ")

        def expect_almost_eq(self, device, lhs, rhs, atol, rtol):
            lv, la = host(device, lhs)
            rv, ra = host(device, rhs)
            if list(lv.shape) != list(rv.shape) or int(lv.element_type) != int(rv.element_type):
                failures.append(f"shape/type mismatch: {list(lv.shape)} vs {list(rv.shape)}")
                return
            a, e = as_f64(lv, la).ravel(), as_f64(rv, ra).ravel()
            with np.errstate(invalid="ignore", over="ignore"):
                ok = (a == e) | (np.isnan(a) & np.isnan(e)) | (
                    np.isfinite(e) & (np.abs(a - e) <= atol + rtol * np.abs(e)))
            if not np.all(ok):
                i = int(np.argmin(ok))
                failures.append(
                    f"not almost equal (atol={atol}, rtol={rtol}): first at index {i}, "
                    f"lhs {a[i]} vs rhs {e[i]}, {int((~ok).sum())} of {ok.size} elements")

    iface = rt.PyModuleInterface("check", Check)
    iface.export("expect_true", "0i_v", Check.expect_true)
    iface.export("expect_false", "0i_v", Check.expect_false)
    iface.export("expect_all_true", "0rr_v", Check.expect_all_true)
    iface.export("expect_eq", "0rrr_v", Check.expect_eq)
    iface.export("expect_almost_eq", "0rrrff_v", Check.expect_almost_eq)
    return iface.create()


CCONV = re.compile(r"\((0[^)]*)\)")


def tests_of(module):
    out = []
    for name in module.function_names:
        if name.startswith("__") or "$" in name:
            continue
        m = CCONV.search(repr(module.lookup_function(name)))
        out.append((name, m.group(1) if m else "?"))
    return out


def run_module(rt, device, path):
    """(passed, failed, lines) for one module."""
    cfg = rt.Config(device)
    failures = []
    check = make_check_module(rt, cfg.device, failures)
    module = rt.VmModule.mmap(cfg.vm_instance, path)
    ctx = rt.SystemContext(vm_modules=[check, module], config=cfg)
    bound = getattr(ctx.modules, module.name)
    passed = failed = 0
    lines = []
    for name, cconv in tests_of(module):
        if cconv != "0v_v":
            lines.append(f"[ SKIPPED  ] {module.name}.{name} (signature '{cconv}')")
            continue
        del failures[:]
        t = time.time()
        try:
            bound[name]()
            error = None
        except Exception as e:  # a failing call (error status) fails the test
            error = f"{type(e).__name__}: {e}"
        ms = (time.time() - t) * 1e3
        if error is None and not failures:
            passed += 1
            lines.append(f"[       OK ] {module.name}.{name} ({ms:.0f} ms)")
        else:
            failed += 1
            why = error or "; ".join(failures[:3])
            lines.append(f"[  FAILED  ] {module.name}.{name} ({ms:.0f} ms): {why[-1500:]}")
    return passed, failed, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", choices=["iree", "ferrite"], required=True)
    ap.add_argument("--device", default="local-task")
    ap.add_argument("modules", nargs="+")
    args = ap.parse_args()
    rt = importlib.import_module(f"{args.runtime}.runtime")
    # Per suite: [tests passed, tests failed, modules passed, modules failed].
    per_suite = defaultdict(lambda: [0, 0, 0, 0])
    total_pass = total_fail = 0
    broken = 0
    for path in args.modules:
        suite = os.path.basename(os.path.dirname(os.path.abspath(path)))
        try:
            p, f, lines = run_module(rt, args.device, path)
        except Exception as e:
            broken += 1
            print(f"[  FAILED  ] {path}: could not run: {type(e).__name__}: {e}", flush=True)
            per_suite[suite][1] += 1
            per_suite[suite][3] += 1
            total_fail += 1
            continue
        for line in lines:
            print(line, flush=True)
        counts = per_suite[suite]
        counts[0] += p
        counts[1] += f
        counts[2 if f == 0 else 3] += 1
        total_pass += p
        total_fail += f
    for suite, (p, f, mp, mf) in sorted(per_suite.items()):
        print(f"{suite}: {p} passed, {f} failed (modules: {mp} passed, {mf} failed)")
    print(f"{total_pass} passed, {total_fail} failed")
    return 1 if total_fail or broken else 0


if __name__ == "__main__":
    sys.exit(main())
