//! The built-in `vm.list` ref type: a growable list of values, refs or
//! variants.
//!
//! The element type fixes the storage, as upstream IREE:
//!
//! - `TypeDef::Value(t)`: packed primitives (`Vec<i8>`, `Vec<i32>`, ...).
//! - `TypeDef::Ref(t)`: optional refs of type `t` (null allowed).
//! - `TypeDef::Any`: one [`Variant`] per slot.
//!
//! # Value conversions (upstream's `get_value_as`/`set_value` rules)
//!
//! - Integer to integer: widening sign-extends, narrowing truncates
//!   (`set_i32(200)` on an `i8` list stores `-56`; `get_i32`/`get_i64` of
//!   an `i8`/`i16` slot sign-extend).
//! - `f32` to `f64` widens, `f64` to `f32` rounds.
//! - Between integers and floats there is **no** conversion: the result is
//!   zero (`set_i32(7)` on an `f32` list stores `0.0`; `get_f32` of an `i32`
//!   slot is `0.0`).
//! - Variant lists store values with the type they were set with
//!   (`set_i32` stores `Variant::I32`) and convert on get by the rules above.
//!
//! # Errors
//!
//! - Index `>= size`: `OUT_OF_RANGE` (`list index 5 out of range (size 3)`).
//! - Value get/set on a ref list, ref get/set on a value list, value get of a
//!   variant slot holding a ref or nothing, ref get of a variant slot holding
//!   a value: `FAILED_PRECONDITION`.
//! - Storing a ref whose type is not the list's element type:
//!   `INVALID_ARGUMENT`.
//!
//! All operations take one lock; refs removed from the list are released
//! after the lock is dropped.

use crate::refs::{Ref, RefObject};
use crate::types::def::TypeDef;
use crate::value::{ValueType, Variant};
use ferrite_base::{bail, status, Result, Status};
use parking_lot::Mutex;

/// Packed storage by element kind.
enum Storage {
    I8(Vec<i8>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Ref(Vec<Option<Ref>>),
    Variant(Vec<Variant>),
}

/// A primitive value in flight between the API and the storage.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Val {
    I8(i8),
    I16(i16),
    I32(i32),
    I64(i64),
    F32(f32),
    F64(f64),
}

impl Val {
    /// Converts to `target` by upstream's rules (see the module docs).
    fn convert(self, target: ValueType) -> Val {
        let int: Option<i64> = match self {
            Val::I8(v) => Some(v as i64),
            Val::I16(v) => Some(v as i64),
            Val::I32(v) => Some(v as i64),
            Val::I64(v) => Some(v),
            _ => None,
        };
        match (target, int, self) {
            (ValueType::I8, Some(i), _) => Val::I8(i as i8),
            (ValueType::I16, Some(i), _) => Val::I16(i as i16),
            (ValueType::I32, Some(i), _) => Val::I32(i as i32),
            (ValueType::I64, Some(i), _) => Val::I64(i),
            (ValueType::F32, _, Val::F32(f)) => Val::F32(f),
            (ValueType::F32, _, Val::F64(f)) => Val::F32(f as f32),
            (ValueType::F64, _, Val::F32(f)) => Val::F64(f as f64),
            (ValueType::F64, _, Val::F64(f)) => Val::F64(f),
            // No int<->float conversion upstream: the result is zero.
            (ValueType::I8, None, _) => Val::I8(0),
            (ValueType::I16, None, _) => Val::I16(0),
            (ValueType::I32, None, _) => Val::I32(0),
            (ValueType::I64, None, _) => Val::I64(0),
            (ValueType::F32, _, _) => Val::F32(0.0),
            (ValueType::F64, _, _) => Val::F64(0.0),
        }
    }

    fn to_variant(self) -> Variant {
        match self {
            Val::I8(v) => Variant::I32(v as i32),
            Val::I16(v) => Variant::I32(v as i32),
            Val::I32(v) => Variant::I32(v),
            Val::I64(v) => Variant::I64(v),
            Val::F32(v) => Variant::F32(v),
            Val::F64(v) => Variant::F64(v),
        }
    }

    fn from_variant(v: &Variant) -> Option<Val> {
        Some(match *v {
            Variant::I32(x) => Val::I32(x),
            Variant::I64(x) => Val::I64(x),
            Variant::F32(x) => Val::F32(x),
            Variant::F64(x) => Val::F64(x),
            Variant::Null | Variant::Ref(_) => return None,
        })
    }

    fn as_i32(self) -> i32 {
        match self.convert(ValueType::I32) {
            Val::I32(v) => v,
            _ => unreachable!(),
        }
    }
    fn as_i64(self) -> i64 {
        match self.convert(ValueType::I64) {
            Val::I64(v) => v,
            _ => unreachable!(),
        }
    }
    fn as_f32(self) -> f32 {
        match self.convert(ValueType::F32) {
            Val::F32(v) => v,
            _ => unreachable!(),
        }
    }
    fn as_f64(self) -> f64 {
        match self.convert(ValueType::F64) {
            Val::F64(v) => v,
            _ => unreachable!(),
        }
    }
}

/// What a slot held before an overwrite; dropped after unlocking.
type Released = Option<Ref>;

struct Inner {
    storage: Storage,
    /// Logical capacity in elements (upstream's growth policy).
    capacity: u64,
}

impl Storage {
    fn new(element_type: &TypeDef) -> Storage {
        match element_type {
            TypeDef::Value(ValueType::I8) => Storage::I8(Vec::new()),
            TypeDef::Value(ValueType::I16) => Storage::I16(Vec::new()),
            TypeDef::Value(ValueType::I32) => Storage::I32(Vec::new()),
            TypeDef::Value(ValueType::I64) => Storage::I64(Vec::new()),
            TypeDef::Value(ValueType::F32) => Storage::F32(Vec::new()),
            TypeDef::Value(ValueType::F64) => Storage::F64(Vec::new()),
            TypeDef::Ref(_) => Storage::Ref(Vec::new()),
            TypeDef::Any => Storage::Variant(Vec::new()),
        }
    }

    fn len(&self) -> usize {
        match self {
            Storage::I8(v) => v.len(),
            Storage::I16(v) => v.len(),
            Storage::I32(v) => v.len(),
            Storage::I64(v) => v.len(),
            Storage::F32(v) => v.len(),
            Storage::F64(v) => v.len(),
            Storage::Ref(v) => v.len(),
            Storage::Variant(v) => v.len(),
        }
    }

    /// Makes room for `total` elements in all (a no-op when already there).
    fn try_reserve(
        &mut self,
        total: usize,
    ) -> std::result::Result<(), std::collections::TryReserveError> {
        fn go<T>(
            v: &mut Vec<T>,
            total: usize,
        ) -> std::result::Result<(), std::collections::TryReserveError> {
            v.try_reserve_exact(total.saturating_sub(v.len()))
        }
        match self {
            Storage::I8(v) => go(v, total),
            Storage::I16(v) => go(v, total),
            Storage::I32(v) => go(v, total),
            Storage::I64(v) => go(v, total),
            Storage::F32(v) => go(v, total),
            Storage::F64(v) => go(v, total),
            Storage::Ref(v) => go(v, total),
            Storage::Variant(v) => go(v, total),
        }
    }

    /// Grows with zeros/nulls, or truncates returning the removed refs.
    fn resize(&mut self, n: usize) -> Vec<Ref> {
        match self {
            Storage::I8(v) => v.resize(n, 0),
            Storage::I16(v) => v.resize(n, 0),
            Storage::I32(v) => v.resize(n, 0),
            Storage::I64(v) => v.resize(n, 0),
            Storage::F32(v) => v.resize(n, 0.0),
            Storage::F64(v) => v.resize(n, 0.0),
            Storage::Ref(v) => {
                if n < v.len() {
                    return v.drain(n..).flatten().collect();
                }
                v.resize(n, None);
            }
            Storage::Variant(v) => {
                if n < v.len() {
                    return v
                        .drain(n..)
                        .filter_map(|x| match x {
                            Variant::Ref(r) => Some(r),
                            _ => None,
                        })
                        .collect();
                }
                v.resize(n, Variant::Null);
            }
        }
        Vec::new()
    }
}

/// A `!vm.list<T>`: a growable list whose element type fixes its storage.
///
/// Thread-safe; every operation takes one mutex.
pub struct VmList {
    element_type: TypeDef,
    inner: Mutex<Inner>,
}

impl RefObject for VmList {
    fn type_name(&self) -> &'static str {
        "vm.list"
    }
}

impl std::fmt::Debug for VmList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmList")
            .field("element_type", &self.element_type.name())
            .field("size", &self.size())
            .finish()
    }
}

fn index_error(i: u32, size: usize) -> Status {
    status!(OutOfRange, "list index {i} out of range (size {size})")
}

/// Upstream's capacity policy: round the request up to a multiple of 64
/// and at least double the old capacity.
fn grown_capacity(old: u64, minimum: u64) -> u64 {
    let aligned = minimum.div_ceil(64) * 64;
    aligned.max(old.saturating_mul(2))
}

impl VmList {
    /// Creates an empty list of `element_type` with room for
    /// `initial_capacity` elements (`RESOURCE_EXHAUSTED` if that cannot be
    /// allocated).
    pub fn new(element_type: TypeDef, initial_capacity: u32) -> Result<VmList> {
        let list = VmList {
            inner: Mutex::new(Inner {
                storage: Storage::new(&element_type),
                capacity: 0,
            }),
            element_type,
        };
        list.reserve(initial_capacity)?;
        Ok(list)
    }

    /// The element type the list was created with.
    pub fn element_type(&self) -> TypeDef {
        self.element_type
    }

    /// The number of elements.
    pub fn size(&self) -> u32 {
        self.inner.lock().storage.len() as u32
    }

    /// The number of elements the list can hold without reallocating
    /// (upstream's policy: requests round up to multiples of 64 and at least
    /// double the previous capacity).
    pub fn capacity(&self) -> u32 {
        self.inner.lock().capacity.min(u32::MAX as u64) as u32
    }

    fn reserve_locked(inner: &mut Inner, minimum: u64) -> Result<()> {
        if inner.capacity >= minimum {
            return Ok(());
        }
        let new_capacity = grown_capacity(inner.capacity, minimum);
        let Ok(n) = usize::try_from(new_capacity) else {
            bail!(
                ResourceExhausted,
                "list capacity {new_capacity} is too large"
            );
        };
        if inner.storage.try_reserve(n).is_err() {
            bail!(
                ResourceExhausted,
                "failed to allocate list storage for {new_capacity} elements"
            );
        }
        inner.capacity = new_capacity;
        Ok(())
    }

    /// `vm.list.reserve`: ensures capacity for at least `minimum_capacity`
    /// elements. Never shrinks.
    pub fn reserve(&self, minimum_capacity: u32) -> Result<()> {
        Self::reserve_locked(&mut self.inner.lock(), minimum_capacity as u64)
    }

    /// `vm.list.resize`: grows with zero values / null refs / empty
    /// variants, or truncates, releasing the refs removed.
    pub fn resize(&self, new_size: u32) -> Result<()> {
        let released = {
            let mut inner = self.inner.lock();
            Self::reserve_locked(&mut inner, new_size as u64)?;
            inner.storage.resize(new_size as usize)
        };
        drop(released);
        Ok(())
    }

    /// Removes all elements (releasing refs); keeps the capacity.
    pub fn clear(&self) {
        let released = self.inner.lock().storage.resize(0);
        drop(released);
    }

    /// Reads slot `i` as a primitive value.
    fn get_value(&self, i: u32) -> Result<Val> {
        let inner = self.inner.lock();
        let size = inner.storage.len();
        let idx = i as usize;
        if idx >= size {
            return Err(index_error(i, size));
        }
        Ok(match &inner.storage {
            Storage::I8(v) => Val::I8(v[idx]),
            Storage::I16(v) => Val::I16(v[idx]),
            Storage::I32(v) => Val::I32(v[idx]),
            Storage::I64(v) => Val::I64(v[idx]),
            Storage::F32(v) => Val::F32(v[idx]),
            Storage::F64(v) => Val::F64(v[idx]),
            Storage::Ref(_) => bail!(
                FailedPrecondition,
                "list of {} does not store values (index {i})",
                self.element_type.name()
            ),
            Storage::Variant(v) => match Val::from_variant(&v[idx]) {
                Some(val) => val,
                None => bail!(
                    FailedPrecondition,
                    "variant at index {i} is not a value type (holds {})",
                    v[idx].kind_name()
                ),
            },
        })
    }

    /// Writes `value` to slot `i`, converting to the element type.
    fn set_value(&self, i: u32, value: Val) -> Result<()> {
        let released = self.set_value_locked(&mut self.inner.lock(), i, value)?;
        drop(released);
        Ok(())
    }

    fn set_value_locked(&self, inner: &mut Inner, i: u32, value: Val) -> Result<Released> {
        let size = inner.storage.len();
        let idx = i as usize;
        if idx >= size {
            return Err(index_error(i, size));
        }
        Ok(match &mut inner.storage {
            Storage::I8(v) => {
                let Val::I8(x) = value.convert(ValueType::I8) else {
                    unreachable!()
                };
                v[idx] = x;
                None
            }
            Storage::I16(v) => {
                let Val::I16(x) = value.convert(ValueType::I16) else {
                    unreachable!()
                };
                v[idx] = x;
                None
            }
            Storage::I32(v) => {
                v[idx] = value.as_i32();
                None
            }
            Storage::I64(v) => {
                v[idx] = value.as_i64();
                None
            }
            Storage::F32(v) => {
                v[idx] = value.as_f32();
                None
            }
            Storage::F64(v) => {
                v[idx] = value.as_f64();
                None
            }
            Storage::Ref(_) => bail!(
                FailedPrecondition,
                "list of {} cannot store values (index {i})",
                self.element_type.name()
            ),
            Storage::Variant(v) => match std::mem::replace(&mut v[idx], value.to_variant()) {
                Variant::Ref(r) => Some(r),
                _ => None,
            },
        })
    }

    /// `vm.list.get.i32`: slot `i` converted to i32 (see the module docs).
    pub fn get_i32(&self, i: u32) -> Result<i32> {
        Ok(self.get_value(i)?.as_i32())
    }

    /// `vm.list.get.i64`: slot `i` converted to i64.
    pub fn get_i64(&self, i: u32) -> Result<i64> {
        Ok(self.get_value(i)?.as_i64())
    }

    /// `vm.list.get.f32`: slot `i` converted to f32.
    pub fn get_f32(&self, i: u32) -> Result<f32> {
        Ok(self.get_value(i)?.as_f32())
    }

    /// `vm.list.get.f64`: slot `i` converted to f64.
    pub fn get_f64(&self, i: u32) -> Result<f64> {
        Ok(self.get_value(i)?.as_f64())
    }

    /// `vm.list.set.i32`: stores `v` at slot `i`, converted to the element
    /// type (variant lists store an i32).
    pub fn set_i32(&self, i: u32, v: i32) -> Result<()> {
        self.set_value(i, Val::I32(v))
    }

    /// `vm.list.set.i64`: stores `v` at slot `i`, converted to the element type.
    pub fn set_i64(&self, i: u32, v: i64) -> Result<()> {
        self.set_value(i, Val::I64(v))
    }

    /// `vm.list.set.f32`: stores `v` at slot `i`, converted to the element type.
    pub fn set_f32(&self, i: u32, v: f32) -> Result<()> {
        self.set_value(i, Val::F32(v))
    }

    /// `vm.list.set.f64`: stores `v` at slot `i`, converted to the element type.
    pub fn set_f64(&self, i: u32, v: f64) -> Result<()> {
        self.set_value(i, Val::F64(v))
    }

    /// `vm.list.get.ref`: the ref at slot `i` of a ref or variant list
    /// (`None` for a null/empty slot). The caller checks the ref's type
    /// against what it expects.
    pub fn get_ref(&self, i: u32) -> Result<Option<Ref>> {
        let inner = self.inner.lock();
        let size = inner.storage.len();
        let idx = i as usize;
        if idx >= size {
            return Err(index_error(i, size));
        }
        match &inner.storage {
            Storage::Ref(v) => Ok(v[idx].clone()),
            Storage::Variant(v) => match &v[idx] {
                Variant::Null => Ok(None),
                Variant::Ref(r) => Ok(Some(r.clone())),
                other => bail!(
                    FailedPrecondition,
                    "variant at index {i} is not a ref (holds {})",
                    other.kind_name()
                ),
            },
            _ => bail!(
                FailedPrecondition,
                "list of {} does not store refs (index {i})",
                self.element_type.name()
            ),
        }
    }

    /// `vm.list.set.ref`: stores `v` at slot `i` of a ref or variant list.
    /// Null is always accepted; a ref must match a ref list's element type
    /// (`INVALID_ARGUMENT`).
    pub fn set_ref(&self, i: u32, v: Option<Ref>) -> Result<()> {
        let released = self.set_ref_locked(&mut self.inner.lock(), i, v)?;
        drop(released);
        Ok(())
    }

    fn set_ref_locked(&self, inner: &mut Inner, i: u32, v: Option<Ref>) -> Result<Released> {
        let size = inner.storage.len();
        let idx = i as usize;
        if idx >= size {
            return Err(index_error(i, size));
        }
        Ok(match &mut inner.storage {
            Storage::Ref(slots) => {
                if let Some(r) = &v {
                    if !self.element_type.accepts_ref(r) {
                        bail!(
                                InvalidArgument,
                                "cannot store a !{} in a list of {} (index {i}): source ref type mismatch",
                                r.type_name(),
                                self.element_type.name()
                            );
                    }
                }
                std::mem::replace(&mut slots[idx], v)
            }
            Storage::Variant(slots) => {
                match std::mem::replace(&mut slots[idx], Variant::from_ref(v)) {
                    Variant::Ref(r) => Some(r),
                    _ => None,
                }
            }
            _ => bail!(
                FailedPrecondition,
                "list of {} cannot store refs (index {i})",
                self.element_type.name()
            ),
        })
    }

    /// Slot `i` as a variant: values of value lists (i8/i16 sign-extended
    /// into [`Variant::I32`]), refs (or [`Variant::Null`]) of ref lists, the
    /// stored variant of variant lists.
    pub fn get_variant(&self, i: u32) -> Result<Variant> {
        let inner = self.inner.lock();
        let size = inner.storage.len();
        let idx = i as usize;
        if idx >= size {
            return Err(index_error(i, size));
        }
        Ok(match &inner.storage {
            Storage::I8(v) => Variant::I32(v[idx] as i32),
            Storage::I16(v) => Variant::I32(v[idx] as i32),
            Storage::I32(v) => Variant::I32(v[idx]),
            Storage::I64(v) => Variant::I64(v[idx]),
            Storage::F32(v) => Variant::F32(v[idx]),
            Storage::F64(v) => Variant::F64(v[idx]),
            Storage::Ref(v) => Variant::from_ref(v[idx].clone()),
            Storage::Variant(v) => v[idx].clone(),
        })
    }

    /// Stores a variant at slot `i`: values as by the `set_*` methods, refs
    /// as by [`set_ref`](Self::set_ref); [`Variant::Null`] clears a ref or
    /// variant slot and is refused (`FAILED_PRECONDITION`) by value lists.
    pub fn set_variant(&self, i: u32, v: Variant) -> Result<()> {
        let released = self.set_variant_locked(&mut self.inner.lock(), i, v)?;
        drop(released);
        Ok(())
    }

    fn set_variant_locked(&self, inner: &mut Inner, i: u32, v: Variant) -> Result<Released> {
        match v {
            Variant::I32(x) => self.set_value_locked(inner, i, Val::I32(x)),
            Variant::I64(x) => self.set_value_locked(inner, i, Val::I64(x)),
            Variant::F32(x) => self.set_value_locked(inner, i, Val::F32(x)),
            Variant::F64(x) => self.set_value_locked(inner, i, Val::F64(x)),
            Variant::Ref(r) => self.set_ref_locked(inner, i, Some(r)),
            Variant::Null => self.set_ref_locked(inner, i, None),
        }
    }

    /// Appends a variant (growing by upstream's capacity policy) and stores
    /// it as [`set_variant`](Self::set_variant) would, all under one lock.
    /// On error the list is left unchanged (upstream would leave the new
    /// slot in place, zero/null).
    pub fn push_variant(&self, v: Variant) -> Result<()> {
        let mut inner = self.inner.lock();
        let size = inner.storage.len();
        if size >= u32::MAX as usize {
            bail!(
                OutOfRange,
                "list size {size} cannot grow past u32::MAX elements"
            );
        }
        Self::reserve_locked(&mut inner, size as u64 + 1)?;
        inner.storage.resize(size + 1);
        match self.set_variant_locked(&mut inner, size as u32, v) {
            Ok(released) => {
                drop(inner);
                drop(released);
                Ok(())
            }
            Err(e) => {
                // The new slot holds nothing to release.
                inner.storage.resize(size);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::VmBuffer;
    use crate::refs::RefType;
    use ferrite_base::StatusCode;

    fn code<T: std::fmt::Debug>(r: Result<T>) -> StatusCode {
        r.expect_err("expected an error").code()
    }

    fn vlist(t: ValueType, n: u32) -> VmList {
        let l = VmList::new(TypeDef::Value(t), 0).unwrap();
        l.resize(n).unwrap();
        l
    }

    fn buffer_type() -> TypeDef {
        TypeDef::Ref(RefType::of::<VmBuffer>("vm.buffer"))
    }

    fn buf() -> Ref {
        Ref::new(VmBuffer::new(4, 0).unwrap())
    }

    #[test]
    fn new_and_capacity_policy() {
        let l = VmList::new(TypeDef::Value(ValueType::I32), 0).unwrap();
        assert_eq!(l.size(), 0);
        assert_eq!(l.capacity(), 0);
        assert_eq!(l.element_type(), TypeDef::Value(ValueType::I32));
        assert_eq!(l.type_name(), "vm.list");
        let l = VmList::new(TypeDef::Value(ValueType::I8), 42).unwrap();
        assert_eq!(l.capacity(), 64);
        l.reserve(100).unwrap();
        assert_eq!(l.capacity(), 128);
        l.reserve(10).unwrap();
        assert_eq!(l.capacity(), 128);
        l.reserve(129).unwrap();
        assert_eq!(l.capacity(), 256);
        assert_eq!(l.size(), 0);
        l.resize(300).unwrap();
        assert_eq!(l.capacity(), 512);
        assert_eq!(l.size(), 300);
    }

    #[test]
    fn reserve_too_large_is_resource_exhausted() {
        let l = VmList::new(TypeDef::Any, 0).unwrap();
        // u32::MAX variants is far beyond any sane allocation on test hosts;
        // either it fails softly or (with overcommit) succeeds without
        // touching memory. It must not panic.
        let _ = l.reserve(u32::MAX);
        assert_eq!(l.size(), 0);
    }

    #[test]
    fn resize_grows_with_zeros_and_shrinks() {
        let l = vlist(ValueType::I32, 3);
        assert_eq!(l.get_i32(2).unwrap(), 0);
        l.set_i32(2, 7).unwrap();
        l.resize(1).unwrap();
        assert_eq!(l.size(), 1);
        l.resize(3).unwrap();
        assert_eq!(l.get_i32(2).unwrap(), 0, "regrown slots are zero");
        l.clear();
        assert_eq!(l.size(), 0);
        assert!(l.capacity() >= 3);
        let f = vlist(ValueType::F64, 2);
        assert_eq!(f.get_f64(1).unwrap(), 0.0);
    }

    #[test]
    fn out_of_range_errors_name_index_and_size() {
        let l = vlist(ValueType::I32, 3);
        let e = l.get_i32(5).unwrap_err();
        assert_eq!(e.code(), StatusCode::OutOfRange);
        assert_eq!(e.message(), "list index 5 out of range (size 3)");
        assert_eq!(code(l.get_i32(3)), StatusCode::OutOfRange);
        assert_eq!(code(l.get_i64(3)), StatusCode::OutOfRange);
        assert_eq!(code(l.get_f32(3)), StatusCode::OutOfRange);
        assert_eq!(code(l.get_f64(3)), StatusCode::OutOfRange);
        assert_eq!(code(l.set_i32(3, 0)), StatusCode::OutOfRange);
        assert_eq!(code(l.set_i64(3, 0)), StatusCode::OutOfRange);
        assert_eq!(code(l.set_f32(3, 0.0)), StatusCode::OutOfRange);
        assert_eq!(code(l.set_f64(3, 0.0)), StatusCode::OutOfRange);
        assert_eq!(code(l.get_variant(3)), StatusCode::OutOfRange);
        assert_eq!(
            code(l.set_variant(3, Variant::I32(1))),
            StatusCode::OutOfRange
        );
        // Index checked before the storage kind, as upstream.
        assert_eq!(code(l.get_ref(3)), StatusCode::OutOfRange);
        assert_eq!(code(l.set_ref(3, None)), StatusCode::OutOfRange);
        let r = VmList::new(buffer_type(), 0).unwrap();
        assert_eq!(code(r.get_ref(0)), StatusCode::OutOfRange);
        assert_eq!(code(r.set_ref(0, Some(buf()))), StatusCode::OutOfRange);
        assert_eq!(code(r.get_i32(u32::MAX)), StatusCode::OutOfRange);
    }

    #[test]
    fn narrow_integer_lists_truncate_and_sign_extend() {
        let l = vlist(ValueType::I8, 2);
        l.set_i32(0, 200).unwrap();
        assert_eq!(l.get_i32(0).unwrap(), -56);
        assert_eq!(l.get_i64(0).unwrap(), -56);
        l.set_i64(1, 0x1_0000_007F).unwrap();
        assert_eq!(l.get_i32(1).unwrap(), 127);
        assert_eq!(l.get_variant(0).unwrap(), Variant::I32(-56));
        let s = vlist(ValueType::I16, 1);
        s.set_i32(0, 0x18000).unwrap();
        assert_eq!(s.get_i32(0).unwrap(), -32768);
        assert_eq!(s.get_i64(0).unwrap(), -32768);
    }

    #[test]
    fn i32_and_i64_lists_convert_between_widths() {
        let l = vlist(ValueType::I32, 1);
        l.set_i64(0, 0x1_2345_6789).unwrap();
        assert_eq!(l.get_i32(0).unwrap(), 0x2345_6789);
        l.set_i32(0, -5).unwrap();
        assert_eq!(l.get_i64(0).unwrap(), -5);
        let w = vlist(ValueType::I64, 1);
        w.set_i32(0, -5).unwrap();
        assert_eq!(w.get_i64(0).unwrap(), -5);
        w.set_i64(0, i64::MIN + 3).unwrap();
        assert_eq!(w.get_i32(0).unwrap(), 3);
        assert_eq!(w.get_variant(0).unwrap(), Variant::I64(i64::MIN + 3));
    }

    #[test]
    fn float_lists_convert_between_widths_but_not_to_ints() {
        let f = vlist(ValueType::F32, 2);
        f.set_f32(0, 1.5).unwrap();
        assert_eq!(f.get_f32(0).unwrap(), 1.5);
        assert_eq!(f.get_f64(0).unwrap(), 1.5);
        f.set_f64(1, 0.1).unwrap();
        assert_eq!(f.get_f32(1).unwrap(), 0.1f64 as f32);
        // No int<->float conversion upstream: zero.
        assert_eq!(f.get_i32(0).unwrap(), 0);
        assert_eq!(f.get_i64(0).unwrap(), 0);
        f.set_i32(0, 200).unwrap();
        assert_eq!(f.get_f32(0).unwrap(), 0.0);
        let d = vlist(ValueType::F64, 1);
        d.set_f64(0, 2.25).unwrap();
        assert_eq!(d.get_f64(0).unwrap(), 2.25);
        assert_eq!(d.get_variant(0).unwrap(), Variant::F64(2.25));
        let i = vlist(ValueType::I32, 1);
        i.set_i32(0, 9).unwrap();
        assert_eq!(i.get_f32(0).unwrap(), 0.0);
        assert_eq!(i.get_f64(0).unwrap(), 0.0);
        i.set_f64(0, 3.0).unwrap();
        assert_eq!(i.get_i32(0).unwrap(), 0);
    }

    #[test]
    fn value_lists_refuse_refs() {
        let l = vlist(ValueType::I32, 1);
        assert_eq!(code(l.get_ref(0)), StatusCode::FailedPrecondition);
        assert_eq!(
            code(l.set_ref(0, Some(buf()))),
            StatusCode::FailedPrecondition
        );
        assert_eq!(code(l.set_ref(0, None)), StatusCode::FailedPrecondition);
        assert_eq!(
            code(l.set_variant(0, Variant::Null)),
            StatusCode::FailedPrecondition
        );
        assert_eq!(
            code(l.push_variant(Variant::Ref(buf()))),
            StatusCode::FailedPrecondition
        );
        assert_eq!(l.size(), 1);
        l.push_variant(Variant::I64(4)).unwrap();
        assert_eq!(l.get_i32(1).unwrap(), 4);
    }

    #[test]
    fn ref_lists_type_check_and_accept_null() {
        let l = VmList::new(buffer_type(), 0).unwrap();
        l.resize(2).unwrap();
        assert_eq!(l.get_ref(0).unwrap(), None);
        let b = buf();
        l.set_ref(0, Some(b.clone())).unwrap();
        assert!(l.get_ref(0).unwrap().unwrap().ptr_eq(&b));
        assert_eq!(b.strong_count(), 2);
        let other = Ref::new(VmList::new(TypeDef::Any, 0).unwrap());
        let e = l.set_ref(1, Some(other.clone())).unwrap_err();
        assert_eq!(e.code(), StatusCode::InvalidArgument);
        assert!(
            e.message().contains("!vm.list") && e.message().contains("!vm.buffer"),
            "{}",
            e.message()
        );
        assert_eq!(
            l.get_ref(1).unwrap(),
            None,
            "failed set leaves slot unchanged"
        );
        l.set_ref(0, None).unwrap();
        assert_eq!(b.strong_count(), 1, "overwrite releases the old ref");
        assert_eq!(code(l.get_i32(0)), StatusCode::FailedPrecondition);
        assert_eq!(code(l.set_i32(0, 1)), StatusCode::FailedPrecondition);
        assert_eq!(code(l.get_f64(0)), StatusCode::FailedPrecondition);
        assert_eq!(code(l.set_f32(0, 1.0)), StatusCode::FailedPrecondition);
        l.set_variant(1, Variant::Ref(b.clone())).unwrap();
        assert_eq!(l.get_variant(1).unwrap(), Variant::Ref(b.clone()));
        assert_eq!(l.get_variant(0).unwrap(), Variant::Null);
        assert_eq!(
            code(l.set_variant(1, Variant::I32(3))),
            StatusCode::FailedPrecondition
        );
        assert_eq!(
            code(l.push_variant(Variant::I32(3))),
            StatusCode::FailedPrecondition
        );
        assert_eq!(
            code(l.push_variant(Variant::Ref(other))),
            StatusCode::InvalidArgument
        );
        assert_eq!(l.size(), 2, "failed pushes leave the list unchanged");
        l.push_variant(Variant::Null).unwrap();
        assert_eq!(l.size(), 3);
    }

    #[test]
    fn shrinking_and_clearing_release_refs() {
        let b = buf();
        let l = VmList::new(buffer_type(), 4).unwrap();
        l.resize(3).unwrap();
        l.set_ref(2, Some(b.clone())).unwrap();
        assert_eq!(b.strong_count(), 2);
        l.resize(2).unwrap();
        assert_eq!(b.strong_count(), 1);
        let v = VmList::new(TypeDef::Any, 0).unwrap();
        v.push_variant(Variant::Ref(b.clone())).unwrap();
        v.push_variant(Variant::I32(1)).unwrap();
        assert_eq!(b.strong_count(), 2);
        v.clear();
        assert_eq!(b.strong_count(), 1);
        v.push_variant(Variant::Ref(b.clone())).unwrap();
        drop(v);
        assert_eq!(b.strong_count(), 1, "dropping the list releases its refs");
    }

    #[test]
    fn variant_lists_hold_anything() {
        let l = VmList::new(TypeDef::Any, 0).unwrap();
        l.resize(6).unwrap();
        assert_eq!(l.get_variant(0).unwrap(), Variant::Null);
        l.set_i32(0, 200).unwrap();
        l.set_i64(1, -1).unwrap();
        l.set_f32(2, 1.5).unwrap();
        l.set_f64(3, 2.5).unwrap();
        let b = buf();
        l.set_ref(4, Some(b.clone())).unwrap();
        assert_eq!(
            l.get_variant(0).unwrap(),
            Variant::I32(200),
            "no narrowing in variant lists"
        );
        assert_eq!(l.get_variant(1).unwrap(), Variant::I64(-1));
        assert_eq!(l.get_variant(2).unwrap(), Variant::F32(1.5));
        assert_eq!(l.get_variant(3).unwrap(), Variant::F64(2.5));
        assert_eq!(l.get_variant(4).unwrap(), Variant::Ref(b.clone()));
        // Gets convert from the stored kind.
        assert_eq!(l.get_i64(0).unwrap(), 200);
        assert_eq!(l.get_i32(1).unwrap(), -1);
        assert_eq!(l.get_f64(2).unwrap(), 1.5);
        assert_eq!(l.get_f32(3).unwrap(), 2.5);
        assert_eq!(l.get_i32(2).unwrap(), 0);
        assert_eq!(l.get_ref(4).unwrap(), Some(b.clone()));
        assert_eq!(l.get_ref(5).unwrap(), None);
        // Wrong kinds.
        let e = l.get_i32(4).unwrap_err();
        assert_eq!(e.code(), StatusCode::FailedPrecondition);
        assert!(e.message().contains("index 4"), "{}", e.message());
        assert_eq!(code(l.get_i32(5)), StatusCode::FailedPrecondition);
        assert_eq!(code(l.get_f32(5)), StatusCode::FailedPrecondition);
        assert_eq!(code(l.get_ref(0)), StatusCode::FailedPrecondition);
        // Overwriting a ref with a value releases it; and vice versa.
        l.set_i32(4, 1).unwrap();
        assert_eq!(b.strong_count(), 1);
        l.set_variant(0, Variant::Ref(b.clone())).unwrap();
        assert_eq!(l.get_ref(0).unwrap(), Some(b.clone()));
        l.set_variant(0, Variant::Null).unwrap();
        assert_eq!(l.get_variant(0).unwrap(), Variant::Null);
        assert_eq!(b.strong_count(), 1);
        // Any ref type is accepted.
        let inner = Ref::new(VmList::new(TypeDef::Any, 0).unwrap());
        l.push_variant(Variant::Ref(inner.clone())).unwrap();
        assert_eq!(l.size(), 7);
        assert_eq!(l.get_ref(6).unwrap(), Some(inner));
    }

    #[test]
    fn push_variant_grows_by_policy() {
        let l = VmList::new(TypeDef::Value(ValueType::F32), 0).unwrap();
        for k in 0..65 {
            l.push_variant(Variant::F32(k as f32)).unwrap();
        }
        assert_eq!(l.size(), 65);
        assert_eq!(l.capacity(), 128);
        assert_eq!(l.get_f32(64).unwrap(), 64.0);
        l.push_variant(Variant::F64(0.5)).unwrap();
        assert_eq!(l.get_f32(65).unwrap(), 0.5);
        l.push_variant(Variant::I32(9)).unwrap();
        assert_eq!(
            l.get_f32(66).unwrap(),
            0.0,
            "int pushed into f32 list is zero"
        );
    }

    #[test]
    fn concurrent_access_is_safe() {
        let l = std::sync::Arc::new(VmList::new(TypeDef::Value(ValueType::I64), 0).unwrap());
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for k in 0..500 {
                        l.push_variant(Variant::I64(t * 1000 + k)).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(l.size(), 2000);
        let mut all: Vec<i64> = (0..2000).map(|i| l.get_i64(i).unwrap()).collect();
        all.sort();
        let mut expected: Vec<i64> = (0..4)
            .flat_map(|t| (0..500).map(move |k| t * 1000 + k))
            .collect();
        expected.sort();
        assert_eq!(all, expected);
    }

    #[test]
    fn debug_format() {
        let l = vlist(ValueType::I8, 2);
        assert_eq!(format!("{l:?}"), "VmList { element_type: \"i8\", size: 2 }");
    }
}
