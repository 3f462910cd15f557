//! [`TypeDef`], an entry of a module's type table. A file of its own so
//! that the containers whose elements it types (`VmList`) name it without
//! naming the registry, which registers them.

use crate::refs::{Ref, RefType};
use crate::value::ValueType;

/// A resolved entry of a module's type table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypeDef {
    /// A primitive value type.
    Value(ValueType),
    /// A specific ref type.
    Ref(RefType),
    /// Any value or ref (`!vm.opaque`, `?`): lists of this type hold variants.
    Any,
}

impl TypeDef {
    /// True when `r` is acceptable where this type is expected.
    pub fn accepts_ref(&self, r: &Ref) -> bool {
        match self {
            TypeDef::Ref(t) => t.matches(r),
            TypeDef::Any => true,
            TypeDef::Value(_) => false,
        }
    }

    /// Upstream-style name (`i32`, `!vm.buffer`, `?`).
    pub fn name(&self) -> String {
        match self {
            TypeDef::Value(v) => v.name().to_string(),
            TypeDef::Ref(r) => format!("!{}", r.name()),
            TypeDef::Any => "?".to_string(),
        }
    }
}
