//! The VM instance: the root object that owns the type registry.
//!
//! Everything a program could observe is reachable from an instance and
//! nothing is process-global, so two instances in one process (or two
//! threads each with their own) never interfere.

use crate::types::TypeRegistry;
use std::sync::Arc;

/// Instance-wide settings.
#[derive(Clone, Debug)]
pub struct InstanceOptions {
    /// Maximum frames per invocation stack.
    pub max_stack_depth: usize,
    /// Compile verified bytecode functions to native code at load (the
    /// `jit` feature; ignored without it). Default: on, unless the
    /// environment variable `FERRITE_VM_JIT` is `0`, `false` or `off`.
    pub jit: bool,
}

impl Default for InstanceOptions {
    fn default() -> Self {
        InstanceOptions {
            max_stack_depth: crate::stack::DEFAULT_MAX_DEPTH,
            jit: jit_default(),
        }
    }
}

/// Whether the compiling tier is on by default (see [`InstanceOptions::jit`]).
pub fn jit_default() -> bool {
    match std::env::var("FERRITE_VM_JIT") {
        Ok(v) => !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "false" | "off" | "no"
        ),
        Err(_) => cfg!(feature = "jit"),
    }
}

/// A VM instance. Cheap to clone (shared).
#[derive(Clone)]
pub struct Instance(Arc<InstanceInner>);

struct InstanceInner {
    types: TypeRegistry,
    options: InstanceOptions,
}

impl Default for Instance {
    fn default() -> Self {
        Instance::new(InstanceOptions::default())
    }
}

impl Instance {
    /// Creates an instance with the built-in `vm.buffer` and `vm.list` types.
    pub fn new(options: InstanceOptions) -> Instance {
        Instance(Arc::new(InstanceInner {
            types: TypeRegistry::default(),
            options,
        }))
    }

    /// The instance's ref type registry.
    pub fn types(&self) -> &TypeRegistry {
        &self.0.types
    }

    /// The instance's options.
    pub fn options(&self) -> &InstanceOptions {
        &self.0.options
    }
}
