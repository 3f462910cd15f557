//! Ferrite's CPU HAL driver.
//!
//! - [`executable`]: loading IREE's CPU executables (`embedded-elf-x86_64`:
//!   the container, our own ELF loader, the executable library ABI) and running
//!   their dispatch functions on host memory.
#![deny(missing_docs)]

pub mod executable;

pub use executable::library::{
    DispatchConfig, ExecutableLibrary, ExportInfo, ImportFunction, ImportTable, LoadOptions,
};
