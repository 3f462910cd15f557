//! A loaded CPU executable as the HAL sees it.

use crate::executable::library::{ExecutableLibrary, LoadOptions};
use ferrite_base::{bail, Result};
use ferrite_hal::executable::{Executable, ExportInfo};
use std::any::Any;

/// Executable formats this driver loads.
pub const FORMATS: &[&str] = &["embedded-elf-x86_64", "system-elf-x86_64"];

/// An executable library loaded for a CPU device.
pub struct CpuExecutable {
    library: ExecutableLibrary,
    exports: Vec<ExportInfo>,
}

impl CpuExecutable {
    /// Loads `data` of `format` with the executable's `constants`. The
    /// executable's native code runs (initializers, query function): it is
    /// trusted as part of the program, as upstream; its container is not
    /// (see [`ExecutableLibrary::load`]).
    pub fn load(format: &str, data: &[u8], constants: &[u32]) -> Result<CpuExecutable> {
        if !FORMATS.contains(&format) {
            bail!(
                Incompatible,
                "executable format '{format}' is not supported by the CPU driver (supported: {})",
                FORMATS.join(", ")
            );
        }
        let options = LoadOptions {
            format: Some(format),
            constants,
            ..LoadOptions::default()
        };
        // SAFETY: the runtime's trust boundary, as upstream's: the native
        // code inside a program's executables is trusted (a module is a
        // program; loading it means running its code), while every byte
        // around that code is checked by the loader before anything runs.
        // This is the one place the CPU driver takes that trust on a
        // module's behalf; `ExecutableLibrary::load` states what it checks.
        let library = unsafe { ExecutableLibrary::load(data, &options) }?;
        let exports = library
            .exports()
            .iter()
            .map(|e| ExportInfo {
                name: e.name.clone(),
                workgroup_size: e.workgroup_size,
                constant_count: e.constant_count,
                binding_count: e.binding_count,
            })
            .collect();
        Ok(CpuExecutable { library, exports })
    }

    /// The loaded library.
    pub fn library(&self) -> &ExecutableLibrary {
        &self.library
    }
}

impl Executable for CpuExecutable {
    fn exports(&self) -> &[ExportInfo] {
        &self.exports
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
