// Our test program for `ferrite e2e-matmul-test`: each function makes
// inputs with the `matmul_test` module, multiplies them itself and asks
// the module to check the product. Everything here must pass;
// matmul_wrong.mlir holds a failing one.

util.func private @matmul_test.generate_random_matrix(!hal.device, i64, i64, i32, i32) -> !hal.buffer_view
util.func private @matmul_test.generate_random_matrix_3d(!hal.device, i64, i64, i64, i32, i32) -> !hal.buffer_view
util.func private @matmul_test.check_matmul_results(!hal.device, i64, i64, i64, i32, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view)
util.func private @matmul_test.check_batch_matmul_results(!hal.device, i64, i64, i64, i64, i32, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view)

// f32 with an accumulator: acc + lhs(3x5) * rhs(5x4).
util.func @f32_accumulate_3x5x4() {
  %c0 = arith.constant 0 : index
  %device = hal.devices.get %c0 : !hal.device
  %m = arith.constant 3 : i64
  %k = arith.constant 5 : i64
  %n = arith.constant 4 : i64
  %f32 = hal.element_type<f32> : i32
  %s1 = arith.constant 1 : i32
  %s2 = arith.constant 2 : i32
  %s3 = arith.constant 3 : i32
  %lhs = util.call @matmul_test.generate_random_matrix(%device, %m, %k, %f32, %s1) : (!hal.device, i64, i64, i32, i32) -> !hal.buffer_view
  %rhs = util.call @matmul_test.generate_random_matrix(%device, %k, %n, %f32, %s2) : (!hal.device, i64, i64, i32, i32) -> !hal.buffer_view
  %acc = util.call @matmul_test.generate_random_matrix(%device, %m, %n, %f32, %s3) : (!hal.device, i64, i64, i32, i32) -> !hal.buffer_view
  %l = hal.tensor.import %lhs : !hal.buffer_view -> tensor<3x5xf32>
  %r = hal.tensor.import %rhs : !hal.buffer_view -> tensor<5x4xf32>
  %a = hal.tensor.import %acc : !hal.buffer_view -> tensor<3x4xf32>
  %p = linalg.matmul ins(%l, %r : tensor<3x5xf32>, tensor<5x4xf32>) outs(%a : tensor<3x4xf32>) -> tensor<3x4xf32>
  %result = hal.tensor.export %p : tensor<3x4xf32> -> !hal.buffer_view
  // A fresh accumulator with the same seed: the product was computed in place.
  %acc_copy = util.call @matmul_test.generate_random_matrix(%device, %m, %n, %f32, %s3) : (!hal.device, i64, i64, i32, i32) -> !hal.buffer_view
  %t = arith.constant 0 : i32
  util.call @matmul_test.check_matmul_results(%device, %m, %k, %n, %t, %lhs, %rhs, %acc_copy, %result) : (!hal.device, i64, i64, i64, i32, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view) -> ()
  util.return
}

// i8 x i8 -> i32 without an accumulator (a null one).
util.func @i8_i32_7x9x6() {
  %c0 = arith.constant 0 : index
  %device = hal.devices.get %c0 : !hal.device
  %m = arith.constant 7 : i64
  %k = arith.constant 9 : i64
  %n = arith.constant 6 : i64
  %i8 = hal.element_type<i8> : i32
  %s1 = arith.constant 11 : i32
  %s2 = arith.constant 12 : i32
  %lhs = util.call @matmul_test.generate_random_matrix(%device, %m, %k, %i8, %s1) : (!hal.device, i64, i64, i32, i32) -> !hal.buffer_view
  %rhs = util.call @matmul_test.generate_random_matrix(%device, %k, %n, %i8, %s2) : (!hal.device, i64, i64, i32, i32) -> !hal.buffer_view
  %l = hal.tensor.import %lhs : !hal.buffer_view -> tensor<7x9xi8>
  %r = hal.tensor.import %rhs : !hal.buffer_view -> tensor<9x6xi8>
  %zero = arith.constant 0 : i32
  %e = tensor.empty() : tensor<7x6xi32>
  %z = linalg.fill ins(%zero : i32) outs(%e : tensor<7x6xi32>) -> tensor<7x6xi32>
  %p = linalg.matmul ins(%l, %r : tensor<7x9xi8>, tensor<9x6xi8>) outs(%z : tensor<7x6xi32>) -> tensor<7x6xi32>
  %result = hal.tensor.export %p : tensor<7x6xi32> -> !hal.buffer_view
  %null = util.null : !hal.buffer_view
  %t = arith.constant 0 : i32
  util.call @matmul_test.check_matmul_results(%device, %m, %k, %n, %t, %lhs, %rhs, %null, %result) : (!hal.device, i64, i64, i64, i32, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view) -> ()
  util.return
}

// f16 x f16 -> f32 with a transposed RHS (N x K), no accumulator.
util.func @f16_f32_transposed_4x8x3() {
  %c0 = arith.constant 0 : index
  %device = hal.devices.get %c0 : !hal.device
  %m = arith.constant 4 : i64
  %k = arith.constant 8 : i64
  %n = arith.constant 3 : i64
  %f16 = hal.element_type<f16> : i32
  %s1 = arith.constant 21 : i32
  %s2 = arith.constant 22 : i32
  %lhs = util.call @matmul_test.generate_random_matrix(%device, %m, %k, %f16, %s1) : (!hal.device, i64, i64, i32, i32) -> !hal.buffer_view
  %rhs = util.call @matmul_test.generate_random_matrix(%device, %n, %k, %f16, %s2) : (!hal.device, i64, i64, i32, i32) -> !hal.buffer_view
  %l = hal.tensor.import %lhs : !hal.buffer_view -> tensor<4x8xf16>
  %r = hal.tensor.import %rhs : !hal.buffer_view -> tensor<3x8xf16>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x3xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<4x3xf32>) -> tensor<4x3xf32>
  %p = linalg.matmul
      indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>,
                       affine_map<(d0, d1, d2) -> (d1, d2)>,
                       affine_map<(d0, d1, d2) -> (d0, d1)>]
      ins(%l, %r : tensor<4x8xf16>, tensor<3x8xf16>) outs(%z : tensor<4x3xf32>) -> tensor<4x3xf32>
  %result = hal.tensor.export %p : tensor<4x3xf32> -> !hal.buffer_view
  %null = util.null : !hal.buffer_view
  %t = arith.constant 1 : i32
  util.call @matmul_test.check_matmul_results(%device, %m, %k, %n, %t, %lhs, %rhs, %null, %result) : (!hal.device, i64, i64, i64, i32, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view) -> ()
  util.return
}

// Batched f32: 2 x (3x4 * 4x5), no accumulator.
util.func @batch_f32_2x3x4x5() {
  %c0 = arith.constant 0 : index
  %device = hal.devices.get %c0 : !hal.device
  %b = arith.constant 2 : i64
  %m = arith.constant 3 : i64
  %k = arith.constant 4 : i64
  %n = arith.constant 5 : i64
  %f32 = hal.element_type<f32> : i32
  %s1 = arith.constant 31 : i32
  %s2 = arith.constant 32 : i32
  %lhs = util.call @matmul_test.generate_random_matrix_3d(%device, %b, %m, %k, %f32, %s1) : (!hal.device, i64, i64, i64, i32, i32) -> !hal.buffer_view
  %rhs = util.call @matmul_test.generate_random_matrix_3d(%device, %b, %k, %n, %f32, %s2) : (!hal.device, i64, i64, i64, i32, i32) -> !hal.buffer_view
  %l = hal.tensor.import %lhs : !hal.buffer_view -> tensor<2x3x4xf32>
  %r = hal.tensor.import %rhs : !hal.buffer_view -> tensor<2x4x5xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x3x5xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<2x3x5xf32>) -> tensor<2x3x5xf32>
  %p = linalg.batch_matmul ins(%l, %r : tensor<2x3x4xf32>, tensor<2x4x5xf32>) outs(%z : tensor<2x3x5xf32>) -> tensor<2x3x5xf32>
  %result = hal.tensor.export %p : tensor<2x3x5xf32> -> !hal.buffer_view
  %null = util.null : !hal.buffer_view
  %t = arith.constant 0 : i32
  util.call @matmul_test.check_batch_matmul_results(%device, %b, %m, %k, %n, %t, %lhs, %rhs, %null, %result) : (!hal.device, i64, i64, i64, i64, i32, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view) -> ()
  util.return
}
