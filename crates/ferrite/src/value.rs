//! [`Value`] and [`Tensor`]: what functions take and return.

use ferrite_base::{bail, status, Result};
use ferrite_hal::allocator::{Allocator, BufferParams};
use ferrite_hal::{BufferUsage, BufferView, ElementType, EncodingType, MemoryType, WHOLE_BUFFER};

mod sealed {
    pub trait Sealed {}
}

/// A Rust number type that can be a tensor element (little-endian, dense).
///
/// Implemented for `i8`..`i64`, `u8`..`u64`, `f32` and `f64`; sealed.
pub trait Element: Copy + sealed::Sealed {
    /// The element type a tensor made from this type gets (`si32` for
    /// `i32`, `ui8` for `u8`, `f32` for `f32`), as upstream's Python API
    /// maps numpy dtypes.
    const ELEMENT_TYPE: ElementType;
    /// Bytes per element.
    const SIZE: usize;
    /// Appends the element's little-endian bytes.
    fn write_le(self, out: &mut Vec<u8>);
    /// Reads an element from exactly [`Self::SIZE`] little-endian bytes.
    fn read_le(bytes: &[u8]) -> Self;
    /// Reads every whole element of `bytes` (little-endian). One loop
    /// compiled where the type is known: a per-element call across crates
    /// (no LTO) cost ~10 ns an element, 8 ms for an LLM batch's 3 MB of
    /// logits.
    fn read_all_le(bytes: &[u8]) -> Vec<Self>;
    /// True when a tensor of `ty` can be read as this type: the same type,
    /// or the signless integer of the same width for integers.
    fn accepts(ty: ElementType) -> bool;
}

macro_rules! element {
    ($t:ty, $et:expr, $signless:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const ELEMENT_TYPE: ElementType = $et;
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline]
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            #[inline]
            fn read_le(bytes: &[u8]) -> Self {
                let mut b = [0u8; std::mem::size_of::<$t>()];
                b.copy_from_slice(bytes);
                <$t>::from_le_bytes(b)
            }
            fn read_all_le(bytes: &[u8]) -> Vec<Self> {
                bytes
                    .chunks_exact(std::mem::size_of::<$t>())
                    .map(|c| {
                        let mut b = [0u8; std::mem::size_of::<$t>()];
                        b.copy_from_slice(c);
                        <$t>::from_le_bytes(b)
                    })
                    .collect()
            }
            fn accepts(ty: ElementType) -> bool {
                let signless: Option<ElementType> = $signless;
                ty == $et || Some(ty) == signless
            }
        }
    };
}

element!(i8, ElementType::SINT_8, Some(ElementType::INT_8));
element!(i16, ElementType::SINT_16, Some(ElementType::INT_16));
element!(i32, ElementType::SINT_32, Some(ElementType::INT_32));
element!(i64, ElementType::SINT_64, Some(ElementType::INT_64));
element!(u8, ElementType::UINT_8, Some(ElementType::INT_8));
element!(u16, ElementType::UINT_16, Some(ElementType::INT_16));
element!(u32, ElementType::UINT_32, Some(ElementType::INT_32));
element!(u64, ElementType::UINT_64, Some(ElementType::INT_64));
element!(f32, ElementType::FLOAT_32, None);
element!(f64, ElementType::FLOAT_64, None);

/// A dense, row-major tensor held in host memory: shape, element type and
/// the elements' little-endian bytes.
///
/// Tensors passed to [`crate::Function::call`] are copied into a buffer
/// from the session's device allocator; tensors returned are copied out, so
/// a `Tensor` never aliases device memory.
#[derive(Clone, PartialEq, Eq)]
pub struct Tensor {
    shape: Vec<u64>,
    element_type: ElementType,
    data: Vec<u8>,
}

fn element_count(shape: &[u64]) -> Result<u64> {
    shape.iter().try_fold(1u64, |acc, &d| {
        acc.checked_mul(d)
            .ok_or_else(|| status!(OutOfRange, "element count of shape {shape:?} overflows"))
    })
}

impl Tensor {
    /// A tensor of `shape` and `element_type` over `data` (dense row-major,
    /// little-endian). Fails with `INVALID_ARGUMENT` when `data` is not
    /// exactly the size the shape and type need.
    pub fn new(shape: &[u64], element_type: ElementType, data: Vec<u8>) -> Result<Tensor> {
        if element_type.bit_count() == 0 {
            bail!(InvalidArgument, "element type {element_type} has no size");
        }
        let need = element_type.dense_byte_count(element_count(shape)?)?;
        if need != data.len() as u64 {
            bail!(
                InvalidArgument,
                "tensor {}x{element_type} needs {need} bytes but {} were given",
                ferrite_hal::buffer_view::format_shape(shape),
                data.len()
            );
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            element_type,
            data,
        })
    }

    /// A tensor of `shape` whose elements are `values` (row-major); the
    /// element type follows `T` (see [`Element::ELEMENT_TYPE`]).
    pub fn from_slice<T: Element>(shape: &[u64], values: &[T]) -> Result<Tensor> {
        let count = element_count(shape)?;
        if count != values.len() as u64 {
            bail!(
                InvalidArgument,
                "shape {} holds {count} elements but {} values were given",
                ferrite_hal::buffer_view::format_shape(shape),
                values.len()
            );
        }
        let mut data = Vec::with_capacity(values.len() * T::SIZE);
        for &v in values {
            v.write_le(&mut data);
        }
        Tensor::new(shape, T::ELEMENT_TYPE, data)
    }

    /// An `f32` tensor of `shape` holding `values`.
    pub fn from_f32(shape: &[u64], values: &[f32]) -> Result<Tensor> {
        Tensor::from_slice(shape, values)
    }

    /// An `si32` tensor of `shape` holding `values`.
    pub fn from_i32(shape: &[u64], values: &[i32]) -> Result<Tensor> {
        Tensor::from_slice(shape, values)
    }

    /// The dimensions.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// The element type.
    pub fn element_type(&self) -> ElementType {
        self.element_type
    }

    /// The elements' bytes (dense, row-major, little-endian).
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Takes the elements' bytes.
    pub fn into_data(self) -> Vec<u8> {
        self.data
    }

    /// The number of elements (1 for rank 0).
    pub fn element_count(&self) -> u64 {
        self.shape.iter().product()
    }

    /// The elements as `T`. Fails with `INVALID_ARGUMENT` naming both types
    /// when the tensor's element type is not `T`'s (signless integers read
    /// as either signedness of their width).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if !T::accepts(self.element_type) {
            bail!(
                InvalidArgument,
                "tensor of {} cannot be read as {} ({})",
                self.element_type,
                std::any::type_name::<T>(),
                T::ELEMENT_TYPE
            );
        }
        Ok(T::read_all_le(&self.data))
    }

    /// The elements as `f32` (the tensor must be `f32`).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        self.to_vec()
    }

    /// The elements as `i32` (the tensor must be `i32` or `si32`).
    pub fn to_i32_vec(&self) -> Result<Vec<i32>> {
        self.to_vec()
    }

    /// Copies the tensor into a new buffer from `allocator` and views it.
    pub fn to_buffer_view(&self, allocator: &dyn Allocator) -> Result<BufferView> {
        let params = BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT);
        let buffer = allocator.allocate(&params, self.data.len() as u64)?;
        if !self.data.is_empty() {
            let mut map = buffer.map_write(0, WHOLE_BUFFER)?;
            map[..self.data.len()].copy_from_slice(&self.data);
        }
        BufferView::new(
            buffer,
            &self.shape,
            self.element_type,
            EncodingType::DENSE_ROW_MAJOR,
        )
    }

    /// Copies a buffer view's elements out of its buffer. Fails with
    /// `UNIMPLEMENTED` for encodings other than dense row-major.
    pub fn from_buffer_view(view: &BufferView) -> Result<Tensor> {
        if view.encoding_type() != EncodingType::DENSE_ROW_MAJOR {
            bail!(
                Unimplemented,
                "reading buffer views of encoding {:?} is not supported",
                view.encoding_type()
            );
        }
        let len = usize::try_from(view.byte_length())
            .map_err(|_| status!(ResourceExhausted, "buffer view too large for host memory"))?;
        let mut data = vec![0u8; len];
        if len > 0 {
            view.buffer().read(0, &mut data)?;
        }
        Tensor::new(view.shape(), view.element_type(), data)
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor({}x{}, {} bytes)",
            ferrite_hal::buffer_view::format_shape(&self.shape),
            self.element_type,
            self.data.len()
        )
    }
}

/// A tensor in a device buffer (a `hal.buffer_view`): what
/// [`crate::Session::upload`] makes and [`crate::IoBinding::output_tensor`]
/// returns. Passing it to a call ([`Value::from`]) passes the buffer itself,
/// no copy; cheap to clone (clones share the buffer).
#[derive(Clone)]
pub struct DeviceTensor {
    view: ferrite_vm::Ref,
}

impl DeviceTensor {
    /// Copies `tensor` into a new buffer from `device`'s allocator.
    pub(crate) fn upload(
        device: Option<&crate::device::Device>,
        tensor: &Tensor,
    ) -> Result<DeviceTensor> {
        let Some(device) = device else {
            bail!(
                FailedPrecondition,
                "uploading a tensor needs a device but the session has none"
            );
        };
        let view = tensor.to_buffer_view(&*device.hal().0.allocator())?;
        Ok(DeviceTensor {
            view: ferrite_vm::Ref::new(view),
        })
    }

    /// Wraps a VM reference to a buffer view. Fails with `INVALID_ARGUMENT`
    /// for any other object.
    pub fn from_ref(r: ferrite_vm::Ref) -> Result<DeviceTensor> {
        if r.downcast::<BufferView>().is_none() {
            bail!(InvalidArgument, "the reference is not a buffer view");
        }
        Ok(DeviceTensor { view: r })
    }

    /// The buffer view.
    pub fn view(&self) -> &BufferView {
        self.view
            .downcast::<BufferView>()
            .expect("DeviceTensor holds a buffer view")
    }

    /// The VM reference (to pass it at the VM layer).
    pub fn vm_ref(&self) -> &ferrite_vm::Ref {
        &self.view
    }

    /// The dimensions.
    pub fn shape(&self) -> &[u64] {
        self.view().shape()
    }

    /// The element type.
    pub fn element_type(&self) -> ElementType {
        self.view().element_type()
    }

    /// Copies the elements to the host.
    pub fn to_host(&self) -> Result<Tensor> {
        Tensor::from_buffer_view(self.view())
    }

    /// Copies the elements into `dst`, which must hold exactly
    /// [`DeviceTensor::shape`]'s element count of `T` (the tensor's element
    /// type, as [`Tensor::to_vec`] reads it). Nothing is allocated: a caller
    /// reading a result of the same size on every call (an LLM's logits)
    /// reuses one buffer instead of faulting in fresh pages each time.
    pub fn read_into<T: Element>(&self, dst: &mut [T]) -> Result<()> {
        let view = self.view();
        if !T::accepts(view.element_type()) {
            bail!(
                InvalidArgument,
                "tensor of {} cannot be read as {} ({})",
                view.element_type(),
                std::any::type_name::<T>(),
                T::ELEMENT_TYPE
            );
        }
        if view.encoding_type() != EncodingType::DENSE_ROW_MAJOR {
            bail!(
                Unimplemented,
                "reading buffer views of encoding {:?} is not supported",
                view.encoding_type()
            );
        }
        let count: u64 = view.shape().iter().product();
        if count != dst.len() as u64 || view.byte_length() != (dst.len() * T::SIZE) as u64 {
            bail!(
                InvalidArgument,
                "reading a {}x{} tensor ({count} elements) into {} elements",
                ferrite_hal::buffer_view::format_shape(view.shape()),
                view.element_type(),
                dst.len()
            );
        }
        if dst.is_empty() {
            return Ok(());
        }
        #[cfg(target_endian = "little")]
        {
            // SAFETY: `Element` is sealed and implemented only for the
            // primitive integers and floats: no padding and every bit
            // pattern is a valid value, so their storage may be written as
            // bytes; the byte slice covers exactly `dst`'s memory and lives
            // no longer than this borrow of it. Little-endian: the bytes are
            // the elements' own representation.
            let bytes = unsafe {
                std::slice::from_raw_parts_mut(
                    dst.as_mut_ptr().cast::<u8>(),
                    std::mem::size_of_val(dst),
                )
            };
            view.buffer().read(0, bytes)
        }
        #[cfg(not(target_endian = "little"))]
        {
            let mut bytes = vec![0u8; std::mem::size_of_val(dst)];
            view.buffer().read(0, &mut bytes)?;
            for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(T::SIZE)) {
                *d = T::read_le(c);
            }
            Ok(())
        }
    }

    /// Overwrites the elements in place with `tensor`'s, which must have the
    /// same shape and element type: every call or binding holding this
    /// tensor sees the new values, and nothing is allocated.
    pub fn write(&self, tensor: &Tensor) -> Result<()> {
        let view = self.view();
        if view.shape() != tensor.shape() || view.element_type() != tensor.element_type() {
            bail!(
                InvalidArgument,
                "writing a {}x{} tensor into a {}x{} device tensor",
                ferrite_hal::buffer_view::format_shape(tensor.shape()),
                tensor.element_type(),
                ferrite_hal::buffer_view::format_shape(view.shape()),
                view.element_type()
            );
        }
        if view.encoding_type() != EncodingType::DENSE_ROW_MAJOR {
            bail!(
                Unimplemented,
                "writing buffer views of encoding {:?} is not supported",
                view.encoding_type()
            );
        }
        if tensor.data().is_empty() {
            return Ok(());
        }
        view.buffer().write(0, tensor.data())
    }
}

impl std::fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceTensor({}x{})",
            ferrite_hal::buffer_view::format_shape(self.shape()),
            self.element_type()
        )
    }
}

impl From<DeviceTensor> for Value {
    /// A [`Value::Ref`] to the buffer view: calls take it as it is.
    fn from(t: DeviceTensor) -> Value {
        Value::Ref(t.view)
    }
}

impl From<&DeviceTensor> for Value {
    fn from(t: &DeviceTensor) -> Value {
        Value::Ref(t.view.clone())
    }
}

/// A function argument or result.
#[derive(Clone, Debug)]
pub enum Value {
    /// No value: a null reference.
    Null,
    /// A 32-bit integer (also i1/i8/i16 scalars).
    I32(i32),
    /// A 64-bit integer.
    I64(i64),
    /// A 32-bit float.
    F32(f32),
    /// A 64-bit float.
    F64(f64),
    /// A tensor (a `hal.buffer_view` in the program).
    Tensor(Tensor),
    /// Any other reference object (a `vm.list`, a `hal.fence`, ...),
    /// passed through untouched.
    Ref(ferrite_vm::Ref),
}

impl Value {
    /// The tensor held, if this is a [`Value::Tensor`].
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// Takes the tensor held, if this is a [`Value::Tensor`].
    pub fn into_tensor(self) -> Option<Tensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// The integer held by [`Value::I32`].
    pub fn as_i32(&self) -> Option<i32> {
        match self {
            Value::I32(v) => Some(*v),
            _ => None,
        }
    }

    /// The integer held by [`Value::I64`] or [`Value::I32`].
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::I64(v) => Some(*v),
            Value::I32(v) => Some(*v as i64),
            _ => None,
        }
    }

    /// The float held by [`Value::F32`].
    pub fn as_f32(&self) -> Option<f32> {
        match self {
            Value::F32(v) => Some(*v),
            _ => None,
        }
    }

    /// The float held by [`Value::F64`] or [`Value::F32`].
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::F64(v) => Some(*v),
            Value::F32(v) => Some(*v as f64),
            _ => None,
        }
    }

    /// A short name of the value's kind, for messages (`i32`, `tensor`).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::I32(_) => "i32",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Tensor(_) => "tensor",
            Value::Ref(_) => "ref",
        }
    }

    /// Converts a VM value, leaving buffer views on the device (as
    /// [`Value::Ref`]; [`DeviceTensor::from_ref`] wraps them).
    pub(crate) fn from_variant_on_device(v: ferrite_vm::Variant) -> Value {
        use ferrite_vm::Variant as V;
        match v {
            V::Null => Value::Null,
            V::I32(x) => Value::I32(x),
            V::I64(x) => Value::I64(x),
            V::F32(x) => Value::F32(x),
            V::F64(x) => Value::F64(x),
            V::Ref(r) => Value::Ref(r),
        }
    }

    /// Converts a VM value, copying buffer views out into [`Tensor`]s.
    pub fn from_variant(v: ferrite_vm::Variant) -> Result<Value> {
        use ferrite_vm::Variant as V;
        Ok(match v {
            V::Null => Value::Null,
            V::I32(x) => Value::I32(x),
            V::I64(x) => Value::I64(x),
            V::F32(x) => Value::F32(x),
            V::F64(x) => Value::F64(x),
            V::Ref(r) => match r.downcast::<BufferView>() {
                Some(view) => Value::Tensor(Tensor::from_buffer_view(view)?),
                None => Value::Ref(r),
            },
        })
    }
}

impl From<std::sync::Arc<ferrite_hal::Fence>> for Value {
    /// A [`Value::Ref`] to the fence: what an async-external function takes
    /// as its wait and signal fences.
    fn from(f: std::sync::Arc<ferrite_hal::Fence>) -> Value {
        Value::Ref(ferrite_vm::Ref::from_arc(f))
    }
}

impl From<i32> for Value {
    fn from(v: i32) -> Value {
        Value::I32(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::I64(v)
    }
}

impl From<f32> for Value {
    fn from(v: f32) -> Value {
        Value::F32(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::F64(v)
    }
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Value {
        Value::Tensor(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_hal::HeapAllocator;

    #[test]
    fn typed_round_trip() {
        let t = Tensor::from_f32(&[2, 2], &[1.0, -2.5, 3.0, 4.0]).unwrap();
        assert_eq!(t.element_type(), ElementType::FLOAT_32);
        assert_eq!(t.data().len(), 16);
        assert_eq!(t.to_f32_vec().unwrap(), vec![1.0, -2.5, 3.0, 4.0]);
        assert!(t.to_i32_vec().is_err());
        let t = Tensor::from_i32(&[3], &[1, -2, 3]).unwrap();
        assert_eq!(t.to_vec::<i32>().unwrap(), vec![1, -2, 3]);
        let signless = Tensor::new(&[1], ElementType::INT_32, 7i32.to_le_bytes().to_vec()).unwrap();
        assert_eq!(signless.to_vec::<i32>().unwrap(), vec![7]);
        assert_eq!(signless.to_vec::<u32>().unwrap(), vec![7]);
        let scalar = Tensor::from_slice::<f64>(&[], &[2.0]).unwrap();
        assert_eq!(scalar.element_count(), 1);
    }

    #[test]
    fn checks_sizes() {
        let e = Tensor::from_f32(&[2, 3], &[1.0]).unwrap_err();
        assert!(e.to_string().contains("holds 6 elements"), "{e}");
        let e = Tensor::new(&[4], ElementType::FLOAT_32, vec![0; 3]).unwrap_err();
        assert!(e.to_string().contains("needs 16 bytes"), "{e}");
    }

    #[test]
    fn buffer_view_round_trip() {
        let t = Tensor::from_i32(&[2, 3], &[1, 2, 3, 4, 5, 6]).unwrap();
        let view = t.to_buffer_view(&HeapAllocator::new()).unwrap();
        assert_eq!(view.to_string(), "2x3xsi32=[1 2 3][4 5 6]");
        assert_eq!(Tensor::from_buffer_view(&view).unwrap(), t);
        let v = Value::from_variant(ferrite_vm::Variant::Ref(ferrite_vm::Ref::new(view))).unwrap();
        assert_eq!(v.as_tensor(), Some(&t));
    }
}
