//! IREE CPU executables (`embedded-elf-*`).
//!
//! Layers, bottom up:
//! - [`container`]: what surrounds the ELF in a module's rodata (a bare ELF or a
//!   FatELF holding one ELF per architecture) and format inference.
//! - [`elf`]: a defensive ELF64 shared-object parser and loader (one private
//!   mapping, x86-64 RELA relocations, per-segment protections).
//! - [`abi`]: `#[repr(C)]` mirrors of the executable library ABI (version 0.6).
//! - [`library`]: [`library::ExecutableLibrary`]: query, validation, exports,
//!   imports and serial dispatch.
//!
//! Native code is trusted, as upstream: once a library is loaded its functions
//! are called as they are. Everything *around* the code (container, ELF headers,
//! dynamic table, relocations, symbol table, library tables) is checked.

pub mod abi;
pub mod container;
pub mod elf;
pub mod library;
