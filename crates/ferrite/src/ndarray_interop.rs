//! Tensors to and from [`ndarray`] arrays (feature `ndarray`).
//!
//! ```
//! use ferrite::Tensor;
//! use ndarray::array;
//!
//! # fn main() -> ferrite::Result<()> {
//! let a = array![[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]];
//! let t = Tensor::from_array(&a)?;
//! assert_eq!(t.shape(), &[2, 3]);
//! let back = t.to_array::<f32>()?;
//! assert_eq!(back, a.into_dyn());
//! # Ok(())
//! # }
//! ```

use ferrite_base::{bail, status, Result};
use ndarray::{ArrayBase, ArrayD, Data, Dimension, IxDyn};

use crate::value::{Element, Tensor};

impl Tensor {
    /// A tensor of `array`'s shape holding its elements in row-major order,
    /// whatever the array's memory layout (transposed and sliced views are
    /// copied in logical order). The element type follows `T` (see
    /// [`Element::ELEMENT_TYPE`]).
    pub fn from_array<T, S, D>(array: &ArrayBase<S, D>) -> Result<Tensor>
    where
        T: Element,
        S: Data<Elem = T>,
        D: Dimension,
    {
        let shape: Vec<u64> = array.shape().iter().map(|&d| d as u64).collect();
        let mut data = Vec::with_capacity(array.len() * T::SIZE);
        match array.as_slice() {
            Some(values) => values.iter().for_each(|&v| v.write_le(&mut data)),
            None => array.iter().for_each(|&v| v.write_le(&mut data)),
        }
        Tensor::new(&shape, T::ELEMENT_TYPE, data)
    }

    /// The elements as an array of the tensor's shape. Fails with
    /// `INVALID_ARGUMENT` when the element type is not `T`'s (as
    /// [`Tensor::to_vec`]).
    pub fn to_array<T: Element>(&self) -> Result<ArrayD<T>> {
        let values = self.to_vec::<T>()?;
        let shape = self
            .shape()
            .iter()
            .map(|&d| {
                usize::try_from(d)
                    .map_err(|_| status!(OutOfRange, "dimension {d} does not fit in usize"))
            })
            .collect::<Result<Vec<usize>>>()?;
        match ArrayD::from_shape_vec(IxDyn(&shape), values) {
            Ok(a) => Ok(a),
            Err(e) => bail!(Internal, "tensor of shape {shape:?} as an array: {e}"),
        }
    }
}

impl<T, S, D> TryFrom<&ArrayBase<S, D>> for Tensor
where
    T: Element,
    S: Data<Elem = T>,
    D: Dimension,
{
    type Error = ferrite_base::Status;

    fn try_from(array: &ArrayBase<S, D>) -> Result<Tensor> {
        Tensor::from_array(array)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ElementType;
    use ndarray::{array, s, Array3};

    #[test]
    fn round_trips_shapes_and_types() {
        let a = array![[1i32, -2, 3], [4, 5, -6]];
        let t = Tensor::from_array(&a).unwrap();
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(t.element_type(), ElementType::SINT_32);
        assert_eq!(t.to_vec::<i32>().unwrap(), vec![1, -2, 3, 4, 5, -6]);
        assert_eq!(t.to_array::<i32>().unwrap(), a.clone().into_dyn());
        // Reading as another type fails as to_vec does.
        assert!(t.to_array::<f32>().is_err());
        // Rank 0 and empty arrays.
        let scalar = ndarray::arr0(2.5f64);
        let t = Tensor::from_array(&scalar).unwrap();
        assert_eq!(t.shape(), &[] as &[u64]);
        assert_eq!(t.to_array::<f64>().unwrap(), scalar.into_dyn());
        let empty = Array3::<u8>::zeros((2, 0, 3));
        let t = Tensor::try_from(&empty).unwrap();
        assert_eq!(t.shape(), &[2, 0, 3]);
        assert_eq!(t.to_array::<u8>().unwrap().shape(), &[2, 0, 3]);
    }

    #[test]
    fn non_contiguous_views_are_read_in_logical_order() {
        let a = array![[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]];
        let t = Tensor::from_array(&a.t()).unwrap();
        assert_eq!(t.shape(), &[3, 2]);
        assert_eq!(t.to_f32_vec().unwrap(), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
        let t = Tensor::from_array(&a.slice(s![.., 1..;-1])).unwrap();
        assert_eq!(t.to_f32_vec().unwrap(), vec![3.0, 2.0, 6.0, 5.0]);
    }
}
