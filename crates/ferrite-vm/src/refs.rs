//! Reference-counted VM objects.
//!
//! A [`Ref`] is an `Arc` of any type implementing [`RefObject`]. The type of
//! a ref is the Rust type of its object; modules name types by string
//! (`!vm.buffer`, `!hal.fence`) and an instance's
//! [`TypeRegistry`](crate::types::TypeRegistry) maps those names to
//! [`RefType`]s. Nothing here is process-global.

use std::any::{Any, TypeId};
use std::fmt;
use std::sync::Arc;

/// An object that can live in a VM ref register (defined in
/// `ferrite-base` so that other layers' types can be refs without
/// depending on the VM).
pub use ferrite_base::object::RefObject;

/// A strong reference to a VM object.
#[derive(Clone)]
pub struct Ref(Arc<dyn RefObject>);

impl Ref {
    /// Wraps a new object.
    pub fn new<T: RefObject>(object: T) -> Ref {
        Ref(Arc::new(object))
    }

    /// Wraps an existing `Arc`.
    pub fn from_arc<T: RefObject>(object: Arc<T>) -> Ref {
        Ref(object)
    }

    /// The object's registered type name.
    pub fn type_name(&self) -> &'static str {
        self.0.type_name()
    }

    /// The Rust type of the object, which identifies its [`RefType`].
    pub fn type_id(&self) -> TypeId {
        let any: &dyn Any = &*self.0;
        any.type_id()
    }

    /// True when the object is a `T`.
    pub fn is<T: RefObject>(&self) -> bool {
        self.type_id() == TypeId::of::<T>()
    }

    /// Borrows the object as a `T`.
    pub fn downcast<T: RefObject>(&self) -> Option<&T> {
        let any: &dyn Any = &*self.0;
        any.downcast_ref::<T>()
    }

    /// Clones out an `Arc<T>` when the object is a `T`.
    pub fn downcast_arc<T: RefObject>(&self) -> Option<Arc<T>> {
        let arc: Arc<dyn Any + Send + Sync> = self.0.clone();
        arc.downcast::<T>().ok()
    }

    /// Turns the ref into an `Arc<T>` when the object is a `T` (the
    /// reference moves over: no count changes); `None` otherwise.
    pub fn into_arc<T: RefObject>(self) -> Option<Arc<T>> {
        let arc: Arc<dyn Any + Send + Sync> = self.0;
        arc.downcast::<T>().ok()
    }

    /// True when both refs point to the same object.
    pub fn ptr_eq(&self, other: &Ref) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The number of strong references (for tests and leak checks).
    pub fn strong_count(&self) -> usize {
        Arc::strong_count(&self.0)
    }
}

impl PartialEq for Ref {
    fn eq(&self, other: &Ref) -> bool {
        self.ptr_eq(other)
    }
}

impl fmt::Debug for Ref {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "!{}@{:p}",
            self.type_name(),
            Arc::as_ptr(&self.0) as *const u8
        )
    }
}

/// A registered ref type: its name and the Rust type that implements it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RefType {
    name: &'static str,
    id: TypeId,
}

impl RefType {
    /// The ref type of Rust type `T` under `name` (no leading `!`).
    pub fn of<T: RefObject>(name: &'static str) -> RefType {
        RefType {
            name,
            id: TypeId::of::<T>(),
        }
    }

    /// The registered name (`vm.buffer`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// True when `r` is an object of this type.
    pub fn matches(&self, r: &Ref) -> bool {
        r.type_id() == self.id
    }
}
