// Our failing program for `ferrite e2e-matmul-test`: the product it hands
// to check_matmul_results starts from an accumulator of ones while the
// check is told there is none, so every element is off by one and the
// check must fail at row 0, column 0.

util.func private @matmul_test.generate_random_matrix(!hal.device, i64, i64, i32, i32) -> !hal.buffer_view
util.func private @matmul_test.check_matmul_results(!hal.device, i64, i64, i64, i32, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view)

util.func @off_by_one_3x5x4() {
  %c0 = arith.constant 0 : index
  %device = hal.devices.get %c0 : !hal.device
  %m = arith.constant 3 : i64
  %k = arith.constant 5 : i64
  %n = arith.constant 4 : i64
  %f32 = hal.element_type<f32> : i32
  %s1 = arith.constant 1 : i32
  %s2 = arith.constant 2 : i32
  %lhs = util.call @matmul_test.generate_random_matrix(%device, %m, %k, %f32, %s1) : (!hal.device, i64, i64, i32, i32) -> !hal.buffer_view
  %rhs = util.call @matmul_test.generate_random_matrix(%device, %k, %n, %f32, %s2) : (!hal.device, i64, i64, i32, i32) -> !hal.buffer_view
  %l = hal.tensor.import %lhs : !hal.buffer_view -> tensor<3x5xf32>
  %r = hal.tensor.import %rhs : !hal.buffer_view -> tensor<5x4xf32>
  %one = arith.constant 1.0 : f32
  %e = tensor.empty() : tensor<3x4xf32>
  %z = linalg.fill ins(%one : f32) outs(%e : tensor<3x4xf32>) -> tensor<3x4xf32>
  %p = linalg.matmul ins(%l, %r : tensor<3x5xf32>, tensor<5x4xf32>) outs(%z : tensor<3x4xf32>) -> tensor<3x4xf32>
  %result = hal.tensor.export %p : tensor<3x4xf32> -> !hal.buffer_view
  %null = util.null : !hal.buffer_view
  %t = arith.constant 0 : i32
  util.call @matmul_test.check_matmul_results(%device, %m, %k, %n, %t, %lhs, %rhs, %null, %result) : (!hal.device, i64, i64, i64, i32, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view) -> ()
  util.return
}
