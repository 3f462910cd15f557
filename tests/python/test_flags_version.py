"""Runtime flags, the version module, and how failures map to exceptions."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import ferrite.runtime as rt
from ferrite.runtime import flags


def _worker_threads():
    """Thread ids of the local-task workers alive in this process."""
    tids = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().startswith("ferrite-worker"):
                    tids.add(tid)
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    return tids


def _all_threads():
    """Ids of every thread of this process: a worker of an earlier device
    that has not run yet (so has not named itself) must not count as new."""
    return set(os.listdir("/proc/self/task"))


def _new_workers(before, expected):
    """Workers started since `before` (from `_all_threads`) was taken.
    Threads name themselves once running, so wait (briefly) for the expected
    count to show; workers of other devices that end meanwhile do not count."""
    deadline = time.monotonic() + 10
    while len(_worker_threads() - before) < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # and make sure no more than that appear
    return len(_worker_threads() - before)


@pytest.fixture
def reset_flags():
    yield
    flags.parse_flags(
        "--task_topology_group_count=0", "--task_topology_max_group_count=64", "--task_worker_stack_size=0",
        "--task_abort_on_failure=false"
    )


def test_group_count_sets_local_task_workers(reset_flags):
    driver = rt.get_driver("local-task")
    devices = []  # kept alive so that worker counts only grow
    for count in (3, 1):
        flags.parse_flags(f"--task_topology_group_count={count}")
        before = _all_threads()
        devices.append(driver.create_default_device())
        assert _new_workers(before, count) == count
    flags.parse_flags("--task_topology_group_count=0", "--task_topology_max_group_count=1")
    before = _all_threads()
    device = rt.get_device("local-task", cache=False)
    assert _new_workers(before, 1) == 1


def test_devices_created_with_flags_still_compute(reset_flags, compile_program):
    # Small worker stacks (the worker-side size is checked by ferrite-hal-cpu's tests).
    flags.parse_flags("--task_topology_group_count=2", "--task_worker_stack_size=65536")
    config = rt.Config(device=rt.get_device("local-task", cache=False))
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.mmap(config.vm_instance, str(compile_program("arith"))))
    a = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(ctx.modules.module.add(a, a).to_host(), a + a)


def test_unknown_and_malformed_flags_raise(reset_flags):
    with pytest.raises(ValueError, match=r"Error parsing flags: INVALID_ARGUMENT; flag 'no_such_flag' not recognized"):
        flags.parse_flags("--no_such_flag=1")
    with pytest.raises(ValueError, match="expected an integer, received 'many'"):
        flags.parse_flags("--task_topology_group_count=many")
    with pytest.raises(ValueError, match="expected true, false"):
        flags.parse_flags("--task_abort_on_failure=perhaps")
    # Positional arguments are left alone, bare booleans mean true, and
    # flags of drivers this build lacks are still accepted.
    flags.parse_flags("positional", "--task_abort_on_failure", "--cuda_use_streams=false")


def test_flagfile(tmp_path, reset_flags):
    f = tmp_path / "flags.txt"
    f.write_text("# comment\n--task_topology_group_count=2\n\n")
    flags.parse_flags(f"--flagfile={f}")
    before = _all_threads()
    d = rt.get_driver("local-task").create_default_device()
    assert _new_workers(before, 2) == 2
    with pytest.raises(ValueError, match="flagfile"):
        flags.parse_flags(f"--flagfile={tmp_path / 'missing.txt'}")


def _python(code, **env):
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )


def test_environment_flags_parse_at_import():
    p = _python(
        "import ferrite.runtime as rt, time\n"
        "d = rt.get_driver('local-task').create_default_device()\n"
        "import os\n"
        "time.sleep(0.5)\n"
        "print(sum(open(f'/proc/self/task/{t}/comm').read().startswith('ferrite-worker') "
        "for t in os.listdir('/proc/self/task')))",
        IREE_PY_RUNTIME_FLAGS="--task_topology_group_count=5",
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "5"
    p = _python("import ferrite.runtime", IREE_PY_RUNTIME_FLAGS="--bogus")
    assert p.returncode != 0
    assert "Bad flag value in environment variable IREE_PY_RUNTIME_FLAGS='--bogus'" in p.stderr


def test_help_lists_flags_and_returns():
    # As upstream 3.13's binding: the help text is printed and the
    # interpreter goes on (the command-line tools exit after --help).
    p = _python("from ferrite.runtime import flags; flags.parse_flags('--help'); print('still here')")
    assert p.returncode == 0
    assert "--task_topology_group_count" in p.stdout and "still here" in p.stdout


def test_load_default_flags_from_env(monkeypatch, reset_flags):
    monkeypatch.setenv("IREE_PY_RUNTIME_FLAGS", "--help")
    flags._load_default_flags_from_env()
    monkeypatch.setenv("IREE_PY_RUNTIME_FLAGS", "--barbar")
    with pytest.raises(RuntimeError, match="IREE_PY_RUNTIME_FLAGS.*barbar"):
        flags._load_default_flags_from_env()


def test_version_module(upstream):
    import importlib

    from ferrite.runtime import version

    theirs = importlib.import_module("iree.runtime.version")
    assert isinstance(version.VERSION, str) and version.VERSION
    assert version.PACKAGE_SUFFIX == ""
    assert set(version.REVISIONS) == set(theirs.REVISIONS)


def test_status_codes_map_to_exceptions_as_upstream(compile_program, upstream):
    """INVALID_ARGUMENT/NOT_FOUND → ValueError, OUT_OF_RANGE → IndexError,
    else RuntimeError, each as "<context>: <CODE>; <message>"."""
    for lib in (rt, upstream):
        instance = lib.VmInstance()
        with pytest.raises(ValueError, match=r"^Error creating vm module from aligned memory: .*INVALID_ARGUMENT; "):
            lib.VmModule.copy_buffer(instance, b"not a module at all, just some bytes")
        lst = lib.VmVariantList(1)
        with pytest.raises(IndexError, match=r"OUT_OF_RANGE; "):
            lst.get_variant(3)
        with pytest.raises(ValueError, match="NOT_FOUND"):
            lib.get_driver("no-such-driver")

        iface = lib.PyModuleInterface("m", lambda i: None)
        iface.export("f", "0v_v", lambda s: 1 / 0)
        m = iface.create()
        ctx = lib.VmContext(instance, modules=(m,))
        with pytest.raises(RuntimeError, match=r"(?s)^Error invoking function: .*UNKNOWN; .*ZeroDivisionError"):
            ctx.invoke(m.lookup_function("f"), lib.VmVariantList(0), lib.VmVariantList(0))
