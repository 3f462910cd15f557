// Self-checking tests (IREE's `check` dialect): three pass, four fail, for
// scripts/check-with-python.py and `ferrite check-module` to agree on.
func.func @almost_eq_within_tolerance() {
  %a = util.unfoldable_constant dense<[1.0, 2.0]> : tensor<2xf16>
  check.expect_almost_eq_const(%a, dense<[1.0, 2.0]> : tensor<2xf16>) : tensor<2xf16>
  %b = util.unfoldable_constant dense<[1.0, -2.5]> : tensor<2xbf16>
  check.expect_almost_eq_const(%b, dense<[1.0, -2.5]> : tensor<2xbf16>) : tensor<2xbf16>
  return
}
func.func @eq_and_true() {
  %a = util.unfoldable_constant dense<[7, -3]> : tensor<2xi32>
  check.expect_eq_const(%a, dense<[7, -3]> : tensor<2xi32>) : tensor<2xi32>
  %c = util.unfoldable_constant 1 : i32
  check.expect_true(%c) : i32
  %z = util.unfoldable_constant 0 : i32
  check.expect_false(%z) : i32
  return
}
func.func @all_true() {
  %t = util.unfoldable_constant dense<[1, 1, 1]> : tensor<3xi8>
  check.expect_all_true(%t) : tensor<3xi8>
  return
}
func.func @almost_eq_off_by_half() {
  %a = util.unfoldable_constant dense<[1.0, 2.0]> : tensor<2xf32>
  check.expect_almost_eq_const(%a, dense<[1.0, 2.5]> : tensor<2xf32>) : tensor<2xf32>
  return
}
func.func @eq_off_by_one() {
  %a = util.unfoldable_constant dense<[1, 2]> : tensor<2xi32>
  check.expect_eq_const(%a, dense<[1, 3]> : tensor<2xi32>) : tensor<2xi32>
  return
}
func.func @true_of_zero() {
  %c = util.unfoldable_constant 0 : i32
  check.expect_true(%c) : i32
  return
}
func.func @bf16_off_by_one() {
  %b = util.unfoldable_constant dense<[1.0, 2.0]> : tensor<2xbf16>
  check.expect_almost_eq_const(%b, dense<[1.0, 3.0]> : tensor<2xbf16>) : tensor<2xbf16>
  return
}
