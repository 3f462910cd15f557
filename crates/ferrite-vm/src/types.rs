//! Type definitions as modules name them, and the per-instance registry
//! that resolves those names.

pub(crate) mod def;

pub use def::TypeDef;

use crate::buffer::VmBuffer;
use crate::list::VmList;
use crate::refs::{RefObject, RefType};
use crate::value::ValueType;
use ferrite_base::{bail, Result};
use parking_lot::RwLock;
use std::collections::HashMap;

/// Maps type names to ref types for one instance.
///
/// `vm.buffer` and `vm.list` are registered at creation; higher layers
/// (the HAL) register their own types. Two instances never share one.
pub struct TypeRegistry {
    types: RwLock<HashMap<String, RefType>>,
}

impl Default for TypeRegistry {
    fn default() -> Self {
        let r = TypeRegistry {
            types: RwLock::new(HashMap::new()),
        };
        r.register(RefType::of::<VmBuffer>("vm.buffer"));
        r.register(RefType::of::<VmList>("vm.list"));
        r
    }
}

impl TypeRegistry {
    /// Registers (or re-registers) a ref type under its name.
    pub fn register(&self, ty: RefType) {
        self.types.write().insert(ty.name().to_string(), ty);
    }

    /// Registers Rust type `T` under `name`.
    pub fn register_type<T: RefObject>(&self, name: &'static str) {
        self.register(RefType::of::<T>(name));
    }

    /// Looks up a ref type by name (no leading `!`).
    pub fn lookup(&self, name: &str) -> Option<RefType> {
        self.types.read().get(name).copied()
    }

    /// Resolves a module type-table name (`i32`, `!vm.list<i32>`,
    /// `!hal.buffer`, `!vm.opaque`) to a [`TypeDef`].
    pub fn resolve(&self, full_name: &str) -> Result<TypeDef> {
        if full_name.is_empty() {
            bail!(InvalidArgument, "type definition has no name");
        }
        if let Some(v) = ValueType::from_name(full_name) {
            return Ok(TypeDef::Value(v));
        }
        if full_name == "!vm.opaque" || full_name == "?" || full_name == "!vm.ref<?>" {
            return Ok(TypeDef::Any);
        }
        let Some(name) = full_name.strip_prefix('!') else {
            bail!(
                NotFound,
                "type '{full_name}' is not a value type nor a ref type (no '!')"
            );
        };
        // Element types of lists are not part of the ref type: lists may be widened.
        let name = if name.starts_with("vm.list") {
            "vm.list"
        } else {
            name
        };
        match self.lookup(name) {
            Some(t) => Ok(TypeDef::Ref(t)),
            None => bail!(
                NotFound,
                "type '{full_name}' is not registered with the instance (registered: {})",
                self.names().join(", ")
            ),
        }
    }

    /// Registered names, sorted (for error messages).
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.types.read().keys().cloned().collect();
        v.sort();
        v
    }
}
