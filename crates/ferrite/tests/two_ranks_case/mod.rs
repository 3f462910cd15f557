//! The `tests/collectives/two_ranks.mlir` case shared by the CPU
//! (`collectives.rs`) and GPU (`multi_gpu.rs`) tests: the rank-dependent
//! inputs, the calls, and the results worked out by hand.

use ferrite::{Result, Session, Tensor, Value};

/// A f32 tensor argument.
pub fn f32_in(shape: &[u64], v: &[f32]) -> Value {
    Value::from(Tensor::from_f32(shape, v).unwrap())
}

/// A f32 tensor result's elements.
pub fn f32_out(v: &Value) -> Vec<f32> {
    v.as_tensor().unwrap().to_f32_vec().unwrap()
}

/// What one rank's calls returned.
pub struct Results {
    sum: Vec<f32>,
    gathered: Vec<f32>,
    scattered: Vec<f32>,
    a2a: Vec<f32>,
    swapped: Vec<f32>,
    around: (Vec<f32>, Vec<f32>),
}

/// Calls every collective export of the module loaded in `s` as rank `r`.
pub fn run(s: &mut Session, r: u32) -> Result<Results> {
    let r = r as f32;
    let sum = s.call("all_reduce_sum", &[f32_in(&[4], &[1. + r, 2., 3., 4. * r])])?;
    let gathered = s.call(
        "all_gather_dim1",
        &[f32_in(&[2, 2], &[r, r + 0.5, 10. + r, 20. + r])],
    )?;
    let scattered = s.call(
        "reduce_scatter_dim0",
        &[f32_in(
            &[4, 2],
            &[1., 2., 3., 4., 5., 6., 7., 8.].map(|x| x * (r + 1.)),
        )],
    )?;
    let a2a = s.call(
        "all_to_all",
        &[f32_in(
            &[4],
            &[10. * r, 10. * r + 1., 10. * r + 2., 10. * r + 3.],
        )],
    )?;
    let swapped = s.call("swap", &[f32_in(&[3], &[r, r, r])])?;
    let around = s.call("compute_around", &[f32_in(&[4], &[r, 1., 2., 3.])])?;
    Ok(Results {
        sum: f32_out(&sum[0]),
        gathered: f32_out(&gathered[0]),
        scattered: f32_out(&scattered[0]),
        a2a: f32_out(&a2a[0]),
        swapped: f32_out(&swapped[0]),
        around: (f32_out(&around[0]), f32_out(&around[1])),
    })
}

/// Checks rank `r`'s results; `what` names the run in messages.
pub fn check(res: &Results, r: usize, what: &str) {
    let rf = r as f32;
    assert_eq!(res.sum, [3., 4., 6., 4.], "all_reduce, {what}");
    // Rows of both ranks side by side along dimension 1.
    assert_eq!(
        res.gathered,
        [0., 0.5, 1., 1.5, 10., 20., 11., 21.],
        "all_gather, {what}"
    );
    // (1 + 2) * x, rank r keeping rows 2r..2r+2.
    let rows = [3., 6., 9., 12., 15., 18., 21., 24.];
    assert_eq!(
        res.scattered,
        rows[4 * r..4 * r + 4],
        "reduce_scatter, {what}"
    );
    assert_eq!(
        res.a2a,
        [2. * rf, 2. * rf + 1., 10. + 2. * rf, 11. + 2. * rf],
        "all_to_all, {what}"
    );
    assert_eq!(res.swapped, [1. - rf; 3], "collective_permute, {what}");
    // x = [r, 1, 2, 3]: all_reduce(x * x) + x, and all_gather(x + x * x).
    assert_eq!(
        res.around.0,
        [1. + rf, 3., 10., 21.],
        "compute_around, {what}"
    );
    assert_eq!(
        res.around.1,
        [0., 2., 6., 12., 2., 2., 6., 12.],
        "compute_around, {what}"
    );
}
