//! Ferrite's VM layer: everything needed to load and run IREE VM modules,
//! knowing nothing of the HAL.
//!
//! - [`value`], [`refs`], [`types`]: values, reference-counted objects and the
//!   per-instance type registry.
//! - [`buffer`], [`list`]: the built-in `vm.buffer` and `vm.list` ref types.
//! - [`module`], [`native`], [`context`], [`instance`]: the module ABI,
//!   Rust-defined modules, linking and instances.
//! - [`stack`], [`invocation`]: frames, coroutines and calling functions.
//! - [`bytecode`]: the `.vmfb` archive reader, verifier, disassembler and
//!   interpreter.
#![deny(missing_docs)]

pub mod buffer;
pub mod bytecode;
pub mod bytes;
pub mod cconv;
pub mod context;
pub mod in_place;
pub mod instance;
pub mod invocation;
pub mod list;
pub mod module;
pub mod native;
pub mod refs;
pub mod stack;
pub mod testing;
pub mod types;
pub mod value;

pub use bytecode::module::BytecodeModule;
pub use bytes::ModuleBytes;
pub use context::Context;
pub use instance::Instance;
pub use invocation::{invoke, Invocation, Poll};
pub use module::{FunctionRef, Module, ModuleState};
pub use refs::Ref;
pub use value::Variant;
