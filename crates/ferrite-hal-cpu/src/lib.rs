//! Ferrite's CPU HAL drivers (they depend on the HAL alone, not the VM).
//!
//! - [`executable`]: loading IREE's CPU executables (`embedded-elf-x86_64`:
//!   the container, our own ELF loader, the executable library ABI) and running
//!   their dispatch functions on host memory.
//! - [`cpu_executable`]: a loaded library as a HAL executable.
//! - [`cpu_features`]: the host's CPU feature bits (processor data, and the
//!   `hal.cpu` device queries).
//! - [`device`]: the `local-sync` and `local-task` devices.
//! - [`channel`]: their collective channels (ranks of one process, each
//!   with its own device, meeting at an in-process group's rendezvous).
//! - [`driver`]: their drivers ([`LocalSyncDriver`], [`LocalTaskDriver`]),
//!   which the facade's driver registry lists; `local-task` reads the
//!   `--task_*` flags from `ferrite_hal::driver::TaskOptions`.
//! - [`pool`]: the worker pool of `local-task`.
//! - [`topology`]: where `local-task`'s default workers run (one pinned
//!   worker per physical core, as upstream).
#![deny(missing_docs)]

pub mod channel;
pub mod cpu_executable;
pub mod cpu_features;
pub mod device;
pub mod driver;
pub mod executable;
pub mod pool;
pub mod topology;

pub use executable::library::{
    DispatchConfig, ExecutableLibrary, ExportInfo, ImportFunction, ImportTable, LoadOptions,
};

pub use device::CpuDevice;
pub use driver::{LocalSyncDriver, LocalTaskDriver};
