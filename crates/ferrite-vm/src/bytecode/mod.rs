//! IREE VM bytecode modules (`.vmfb`, bytecode version 17.0).
//!
//! - [`archive`]: reading the FlatBuffer container, defensively.
//! - [`isa`] (generated from the ISA description) and [`isa_types`]: opcodes
//!   and operand encodings.
//! - [`verifier`]: verifying and decoding each function once at load.
//! - `interp`: the interpreter (frames, calls, the native bridge and the
//!   dispatch loop), which relies on the verifier's facts as its unsafe
//!   contract: only verified bytecode is interpreted. Its register window,
//!   [`Registers`], is public for its documented contract: its unchecked
//!   accessors take only bank-typed registers of the right width.
//! - [`jit`] (feature `jit`): the compiling tier (Cranelift).
//! - [`module`]: bytecode modules and their per-context state.
//!
//! # Limits on what a module file may ask for
//!
//! Every count or size read from a file is checked before anything is
//! allocated from it, and allocation failure is an error, never an abort:
//!
//! - metadata decoded from the FlatBuffer is bounded by a budget of 16x the
//!   FlatBuffer's size (aliased offsets cannot make a small file describe a
//!   huge object graph);
//! - module state: at most [`module::MAX_GLOBAL_BYTES`] bytes of primitive
//!   globals and [`module::MAX_REF_GLOBALS`] ref globals
//!   (`RESOURCE_EXHAUSTED` beyond, as upstream answers a state it cannot
//!   allocate);
//! - registers: 32K i32 and 16K ref registers per function (as upstream),
//!   and at most [`crate::stack::MAX_REGISTER_BYTES`] of register storage
//!   and [`crate::stack::DEFAULT_MAX_DEPTH`] frames per stack;
//! - `vm.list` and `vm.buffer` sizes computed at run time are allocated
//!   with `try_reserve` (`RESOURCE_EXHAUSTED` when refused).
//!
//! Beyond the limits, the loader is at least as strict as upstream's: the
//! FlatBuffer structure as flatcc verifies it, feature requirement bits,
//! exact block counts, even 64-bit register ordinals.

pub mod archive;
mod cmath;
pub mod disasm;
pub(crate) mod interp;
pub mod isa;
pub mod isa_types;
#[cfg(feature = "jit")]
pub mod jit;
pub mod module;
pub mod trace;
pub mod verifier;

pub use interp::Registers;
