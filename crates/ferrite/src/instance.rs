//! [`Instance`]: the root object.

/// The root object: a VM instance whose type registry knows the HAL's ref
/// types (`hal.buffer_view`, `hal.device`, `hal.fence`, ...). Cheap to clone
/// (shared); sessions made from it keep it alive.
#[derive(Clone)]
pub struct Instance {
    vm: ferrite_vm::Instance,
}

impl Instance {
    /// A new instance with default VM options and the HAL types registered.
    pub fn new() -> Instance {
        Instance::from_vm(ferrite_vm::Instance::default())
    }

    /// Wraps an existing VM instance, registering the HAL types in it
    /// (registering twice is harmless).
    pub fn from_vm(vm: ferrite_vm::Instance) -> Instance {
        ferrite_hal_module::register_types(vm.types());
        Instance { vm }
    }

    /// The underlying VM instance, for code that works at the VM layer.
    pub fn vm(&self) -> &ferrite_vm::Instance {
        &self.vm
    }
}

impl Default for Instance {
    fn default() -> Self {
        Instance::new()
    }
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ferrite::Instance")
    }
}
