// Our test program for `ferrite e2e-attention-test`. Its "attention" gives
// every query the plain mean of the value rows (what attention computes
// when all scores are equal), which lies within the range the check
// accepts; the wrong variant adds 100 to every element, outside it.

util.func private @attention_test.generate_random_tensor(!hal.device, i64, i64, i64, i32, i32) -> !hal.buffer_view
util.func private @attention_test.check_attention_results(!hal.device, i64, i64, i64, i64, i64, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view)

// b=2, m=3, k1=4, k2=5, n=6: result[b, m, n] = mean over k2 of value[b, k2, n].
util.func private @mean_attention(%bias: f32) -> (!hal.device, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view) {
  %c0 = arith.constant 0 : index
  %device = hal.devices.get %c0 : !hal.device
  %b = arith.constant 2 : i64
  %m = arith.constant 3 : i64
  %k1 = arith.constant 4 : i64
  %k2 = arith.constant 5 : i64
  %n = arith.constant 6 : i64
  %f32 = hal.element_type<f32> : i32
  %s1 = arith.constant 1 : i32
  %s2 = arith.constant 2 : i32
  %s3 = arith.constant 3 : i32
  %query = util.call @attention_test.generate_random_tensor(%device, %b, %m, %k1, %f32, %s1) : (!hal.device, i64, i64, i64, i32, i32) -> !hal.buffer_view
  %key = util.call @attention_test.generate_random_tensor(%device, %b, %k2, %k1, %f32, %s2) : (!hal.device, i64, i64, i64, i32, i32) -> !hal.buffer_view
  %value = util.call @attention_test.generate_random_tensor(%device, %b, %k2, %n, %f32, %s3) : (!hal.device, i64, i64, i64, i32, i32) -> !hal.buffer_view
  %v = hal.tensor.import %value : !hal.buffer_view -> tensor<2x5x6xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x3x6xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<2x3x6xf32>) -> tensor<2x3x6xf32>
  %sum = linalg.generic {
      indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>,
                       affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%v : tensor<2x5x6xf32>) outs(%z : tensor<2x3x6xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %fifth = arith.constant 0.2 : f32
    %w = arith.mulf %x, %fifth : f32
    %r = arith.addf %acc, %w : f32
    linalg.yield %r : f32
  } -> tensor<2x3x6xf32>
  %biases = tensor.splat %bias : tensor<2x3x6xf32>
  %out = arith.addf %sum, %biases : tensor<2x3x6xf32>
  %result = hal.tensor.export %out : tensor<2x3x6xf32> -> !hal.buffer_view
  util.return %device, %query, %key, %value, %result : !hal.device, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view
}

util.func @mean_is_within_range() {
  %bias = arith.constant 0.0 : f32
  %device, %q, %k, %v, %r = util.call @mean_attention(%bias) : (f32) -> (!hal.device, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view)
  %b = arith.constant 2 : i64
  %m = arith.constant 3 : i64
  %k1 = arith.constant 4 : i64
  %k2 = arith.constant 5 : i64
  %n = arith.constant 6 : i64
  util.call @attention_test.check_attention_results(%device, %b, %m, %k1, %k2, %n, %q, %k, %v, %r) : (!hal.device, i64, i64, i64, i64, i64, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view) -> ()
  util.return
}

util.func @out_of_range_fails() {
  %bias = arith.constant 100.0 : f32
  %device, %q, %k, %v, %r = util.call @mean_attention(%bias) : (f32) -> (!hal.device, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view)
  %b = arith.constant 2 : i64
  %m = arith.constant 3 : i64
  %k1 = arith.constant 4 : i64
  %k2 = arith.constant 5 : i64
  %n = arith.constant 6 : i64
  util.call @attention_test.check_attention_results(%device, %b, %m, %k1, %k2, %n, %q, %k, %v, %r) : (!hal.device, i64, i64, i64, i64, i64, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view) -> ()
  util.return
}
