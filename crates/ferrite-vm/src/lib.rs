//! Ferrite's VM layer: everything needed to load and run IREE VM modules,
//! knowing nothing of the HAL.
//!
//! - [`value`], [`refs`], [`types`]: values, reference-counted objects and the
//!   per-instance type registry.
//! - [`buffer`], [`list`]: the built-in `vm.buffer` and `vm.list` ref types.
//! - [`module`], [`native`], [`context`], [`instance`]: the module ABI,
//!   Rust-defined modules, linking and instances.
//! - [`invocation`]: calling exported functions, coroutine scheduling.
//! - [`bytecode`]: the `.vmfb` archive reader, verifier, disassembler and
//!   interpreter.
#![deny(missing_docs)]

pub mod bytecode;
pub mod bytes;
