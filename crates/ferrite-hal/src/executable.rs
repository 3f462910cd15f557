//! Executables: the compiled kernels of one `hal.executable`, as a device
//! loaded them.
//!
//! The HAL only needs to name and look up exports; running a dispatch is the
//! device's business, so drivers downcast to their own executable type.

use crate::memory::MemoryAccess;
use ferrite_base::RefObject;
use std::any::Any;
use std::sync::Arc;

/// One entry point of an executable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    /// Export name (`add_dispatch_0_elementwise_4_f32`).
    pub name: String,
    /// Static workgroup size, when the executable declares one.
    pub workgroup_size: [u32; 3],
    /// Constants (push constants) the export reads, when known.
    pub constant_count: u32,
    /// Bindings the export reads/writes, when known.
    pub binding_count: u32,
}

/// A device-loaded executable.
pub trait Executable: Send + Sync + 'static {
    /// The executable's exports in ordinal order.
    fn exports(&self) -> &[ExportInfo];
    /// For drivers: downcast to the concrete type.
    fn as_any(&self) -> &dyn Any;

    /// The access export `export`'s kernel may make to binding `binding`;
    /// devices resolve the bound buffer range with it, so read-only storage
    /// (a read-only import: parameters mapped from a file, host arrays
    /// imported read-only) bound where a kernel may write is refused before
    /// the kernel runs. A format that marks read-only bindings (CUDA's
    /// `binding_flags`) answers `READ` for those and `READ | WRITE` for the
    /// rest; one that does not (the CPU library ABI) answers `ANY`, as
    /// upstream's validation does: writable storage serves such a binding,
    /// and read-only storage only when it is a program constant
    /// ([`HostMemory::program_constant`](crate::buffer::HostMemory::program_constant)),
    /// which no kernel writes.
    fn binding_access(&self, export: u32, binding: usize) -> MemoryAccess {
        let _ = (export, binding);
        MemoryAccess::ANY
    }

    /// The ordinal of the export named `name`.
    fn lookup_export(&self, name: &str) -> Option<u32> {
        self.exports()
            .iter()
            .position(|e| e.name == name)
            .map(|i| i as u32)
    }
}

/// The VM ref type `hal.executable`.
#[derive(Clone)]
pub struct ExecutableRef(pub Arc<dyn Executable>);

impl RefObject for ExecutableRef {
    fn type_name(&self) -> &'static str {
        "hal.executable"
    }
}

impl std::fmt::Debug for ExecutableRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "hal.executable({} exports)", self.0.exports().len())
    }
}
