"""The high-level API: configurations, system contexts and bound modules."""

import difflib
import os
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from ._binding import VmContext, VmInstance, VmModule, create_hal_module
from .function import FunctionInvoker
from .system_setup import get_first_device

__all__ = [
    "TARGET_BACKEND_TO_DRIVER",
    "normalize_value",
    "BoundModule",
    "Config",
    "SystemContext",
    "load_vm_flatbuffer",
    "load_vm_flatbuffer_file",
    "load_vm_module",
    "load_vm_modules",
]


# The driver that runs what each compiler target backend produces.
TARGET_BACKEND_TO_DRIVER = {
    "llvm-cpu": "local-task",
    "vmvx": "local-task",
    "vulkan-spirv": "vulkan",
}


def normalize_value(value: Any) -> Optional[Union[np.ndarray, List[Any], Tuple[Any], dict]]:
    """`value` as the runtime takes it: containers and None unchanged, all
    else an array, with Python ints and floats narrowed to 32 bits."""
    if value is None or isinstance(value, (list, tuple, dict)):
        return value
    array = np.asarray(value)
    if isinstance(value, (bool, int, float)):
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        elif array.dtype == np.int64:
            array = array.astype(np.int32)
    return array


class Config:
    """A VM instance, a device and the default modules (`hal`) over it."""

    def __init__(self, driver_name: Optional[str] = None, hal_module_kwargs=None, *, device=None):
        if device is not None and driver_name is not None:
            raise ValueError("Either 'device' or 'driver_name' can be specified (not both)")
        self.vm_instance = VmInstance()
        if device is None:
            # `driver_name` may list several ("cuda,local-task"): the first
            # that works, as get_first_device (which also reads
            # IREE_DEFAULT_DEVICE when no name is given).
            device = get_first_device(driver_name.split(",") if driver_name is not None else None)
        self.device = device
        hal = create_hal_module(self.vm_instance, device, **(hal_module_kwargs or {}))
        self.default_vm_modules = (hal,)


class BoundModule:
    """A module in a context; its functions are attributes (FunctionInvokers)."""

    def __init__(self, context: "SystemContext", vm_module: VmModule):
        self._context = context
        self._vm_module = vm_module
        self._lazy = {}

    @property
    def name(self):
        return self._vm_module.name

    @property
    def vm_module(self):
        return self._vm_module

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(e.args[0] if e.args else name) from None

    def __getitem__(self, name):
        invoker = self._lazy.get(name)
        if invoker is None:
            f = self._vm_module.lookup_function(name)
            if f is None:
                raise KeyError(_not_found_message(name, self))
            invoker = FunctionInvoker(self._context.vm_context, self._context.config.device, f)
            self._lazy[name] = invoker
        return invoker

    def __repr__(self):
        return f"<BoundModule {self._vm_module!r}>"


def _not_found_message(name, bound: "BoundModule") -> str:
    """Upstream's words, with the functions the module does have (bounded)."""
    names = [n for n in bound.vm_module.function_names if not n.startswith("__")]
    shown = ", ".join(names[:_MAX_LISTED_NAMES])
    if len(names) > _MAX_LISTED_NAMES:
        shown += f", ... ({len(names) - _MAX_LISTED_NAMES} more)"
    close = difflib.get_close_matches(str(name), names, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return (f"Function '{name}' not found in module '{bound.name}'{hint} "
            f"(functions: {shown or 'none'})")


# The most function names a not-found message lists.
_MAX_LISTED_NAMES = 20


class Modules(dict):
    """Bound modules by name, also reachable as attributes."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class SystemContext:
    """A VM context over a config's device, with modules bound by name."""

    def __init__(self, vm_modules=None, config: Optional[Config] = None):
        self._config = config if config is not None else Config()
        self._is_dynamic = vm_modules is None
        modules = list(self._config.default_vm_modules)
        if self._is_dynamic:
            # As upstream: a dynamic context is made empty and registers
            # the default modules (a context made with modules is static
            # and refuses `register_modules`).
            self._vm_context = VmContext(self._config.vm_instance)
            self._vm_context.register_modules(modules)
        else:
            modules.extend(vm_modules)
            self._vm_context = VmContext(self._config.vm_instance, modules=modules)
        self._bound = Modules((m.name, BoundModule(self, m)) for m in modules)

    @property
    def vm_context(self) -> VmContext:
        return self._vm_context

    @property
    def is_dynamic(self) -> bool:
        """True when made without `vm_modules` (modules are added later)."""
        return self._is_dynamic

    @property
    def instance(self) -> VmInstance:
        return self._config.vm_instance

    @property
    def config(self) -> Config:
        return self._config

    @property
    def modules(self) -> Modules:
        return self._bound

    def add_vm_modules(self, vm_modules: Sequence[VmModule]):
        """Registers more modules (only on a dynamic context); names must be new."""
        assert self._is_dynamic, "Cannot 'add_module' on a static context"
        vm_modules = list(vm_modules)
        for m in vm_modules:
            if m.name in self._bound:
                raise ValueError(f"Attempt to register duplicate VmModule: '{m.name}'")
        self._vm_context.register_modules(vm_modules)
        for m in vm_modules:
            self._bound[m.name] = BoundModule(self, m)

    def add_vm_module(self, vm_module: VmModule):
        self.add_vm_modules((vm_module,))

    def add_module_dependency(self, name, minimum_version=0):
        """Registers the module `name` resolved by `VmModule.resolve_module_dependency`."""
        resolved = VmModule.resolve_module_dependency(
            self._config.vm_instance, name, minimum_version
        )
        self._vm_context.register_modules([resolved])


def load_vm_modules(*vm_modules, config: Optional[Config] = None):
    """Loads modules into one new context; returns their BoundModules in order."""
    context = SystemContext(vm_modules=vm_modules, config=config)
    return [context.modules[m.name] for m in vm_modules]


def load_vm_module(vm_module, config: Optional[Config] = None):
    """Loads one module into a new context; returns its BoundModule."""
    return load_vm_modules(vm_module, config=config)[0]


def _config_for(driver, backend):
    """The config for a driver name, or for the driver of a compiler backend."""
    if driver is None and backend is None:
        raise ValueError("Either 'driver' or 'backend' must be specified, but got 'None' for both.")
    if driver is not None and backend is not None:
        raise ValueError("Cannot specify both 'driver' and a 'backend' to infer the driver from.")
    if backend is not None:
        try:
            driver = TARGET_BACKEND_TO_DRIVER[backend]
        except KeyError:
            raise ValueError(
                f"Unknown backend '{backend}' (known: {', '.join(sorted(TARGET_BACKEND_TO_DRIVER))})"
            ) from None
    return Config(driver)


def load_vm_flatbuffer(vm_flatbuffer: bytes, *, driver: Optional[str] = None, backend: Optional[str] = None):
    """Loads a `.vmfb` held in memory; returns its BoundModule."""
    config = _config_for(driver, backend)
    vm_module = VmModule.copy_buffer(config.vm_instance, vm_flatbuffer)
    return load_vm_module(vm_module, config)


def load_vm_flatbuffer_file(
    path: str, *, driver: Optional[str] = None, backend: Optional[str] = None, destroy_callback=None
):
    """Loads a `.vmfb` file (memory-mapped); returns its BoundModule.
    `destroy_callback` runs once the mapping is no longer used."""
    config = _config_for(driver, backend)
    vm_module = VmModule.mmap(config.vm_instance, os.fspath(path), destroy_callback=destroy_callback)
    return load_vm_module(vm_module, config)
