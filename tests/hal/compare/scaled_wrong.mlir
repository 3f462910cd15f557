// scaled.mlir with the constant 2.5 instead of 2.0: the same dispatch
// export, other values (the differential mode must name it).
func.func @scaled() {
  %x = util.unfoldable_constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %c = arith.constant dense<2.5> : tensor<4xf32>
  %y = arith.mulf %x, %c : tensor<4xf32>
  check.expect_almost_eq_const(%y, dense<[2.0, 4.0, 6.0, 8.0]> : tensor<4xf32>) : tensor<4xf32>
  return
}
