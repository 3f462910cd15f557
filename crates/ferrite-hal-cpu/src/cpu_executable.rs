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
    /// Loads `data` of `format` with the executable's `constants`.
    pub fn load(format: &str, data: &[u8], constants: &[u32]) -> Result<CpuExecutable> {
        if !FORMATS.contains(&format) {
            bail!(
                Incompatible,
                "executable format '{format}' is not supported by the CPU driver (supported: {})",
                FORMATS.join(", ")
            );
        }
        let library = ExecutableLibrary::load(
            data,
            &LoadOptions {
                format: Some(format),
                constants,
                ..LoadOptions::default()
            },
        )?;
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
