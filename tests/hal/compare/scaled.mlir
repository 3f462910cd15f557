// A self-checking program for the differential mode (check-module
// --compare_device); scaled_wrong.mlir is the same program with another
// constant, so its one dispatch (same export name) writes other values.
func.func @scaled() {
  %x = util.unfoldable_constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %c = arith.constant dense<2.0> : tensor<4xf32>
  %y = arith.mulf %x, %c : tensor<4xf32>
  check.expect_almost_eq_const(%y, dense<[2.0, 4.0, 6.0, 8.0]> : tensor<4xf32>) : tensor<4xf32>
  return
}
