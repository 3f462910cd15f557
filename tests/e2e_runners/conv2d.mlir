// Our test program for `ferrite e2e-conv2d-test`: NCHW input 1x2x6x7,
// FCHW kernel 3x2x3x2, stride 1x2, dilation 2x1, with an accumulator; the
// module checks the convolution computed here.

util.func private @conv2d_test.generate_random_tensor(!hal.device, i64, i64, i64, i64, i32, i32) -> !hal.buffer_view
util.func private @conv2d_test.check_conv2d_results(!hal.device, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view)

util.func @f32_strided_dilated() {
  %c0 = arith.constant 0 : index
  %device = hal.devices.get %c0 : !hal.device
  %n = arith.constant 1 : i64
  %c = arith.constant 2 : i64
  %h = arith.constant 6 : i64
  %w = arith.constant 7 : i64
  %f = arith.constant 3 : i64
  %kh = arith.constant 3 : i64
  %kw = arith.constant 2 : i64
  %sh = arith.constant 1 : i64
  %sw = arith.constant 2 : i64
  %dh = arith.constant 2 : i64
  %dw = arith.constant 1 : i64
  // Output: oh = (6 - 5) / 1 + 1 = 2, ow = (7 - 2) / 2 + 1 = 3.
  %oh = arith.constant 2 : i64
  %ow = arith.constant 3 : i64
  %f32 = hal.element_type<f32> : i32
  %s1 = arith.constant 5 : i32
  %s2 = arith.constant 6 : i32
  %s3 = arith.constant 7 : i32
  %input = util.call @conv2d_test.generate_random_tensor(%device, %n, %c, %h, %w, %f32, %s1) : (!hal.device, i64, i64, i64, i64, i32, i32) -> !hal.buffer_view
  %kernel = util.call @conv2d_test.generate_random_tensor(%device, %f, %c, %kh, %kw, %f32, %s2) : (!hal.device, i64, i64, i64, i64, i32, i32) -> !hal.buffer_view
  %acc = util.call @conv2d_test.generate_random_tensor(%device, %n, %f, %oh, %ow, %f32, %s3) : (!hal.device, i64, i64, i64, i64, i32, i32) -> !hal.buffer_view
  %i = hal.tensor.import %input : !hal.buffer_view -> tensor<1x2x6x7xf32>
  %k = hal.tensor.import %kernel : !hal.buffer_view -> tensor<3x2x3x2xf32>
  %a = hal.tensor.import %acc : !hal.buffer_view -> tensor<1x3x2x3xf32>
  %r = linalg.conv_2d_nchw_fchw {dilations = dense<[2, 1]> : tensor<2xi64>, strides = dense<[1, 2]> : tensor<2xi64>}
      ins(%i, %k : tensor<1x2x6x7xf32>, tensor<3x2x3x2xf32>) outs(%a : tensor<1x3x2x3xf32>) -> tensor<1x3x2x3xf32>
  %result = hal.tensor.export %r : tensor<1x3x2x3xf32> -> !hal.buffer_view
  %acc_copy = util.call @conv2d_test.generate_random_tensor(%device, %n, %f, %oh, %ow, %f32, %s3) : (!hal.device, i64, i64, i64, i64, i32, i32) -> !hal.buffer_view
  util.call @conv2d_test.check_conv2d_results(%device, %n, %c, %h, %w, %f, %kh, %kw, %sh, %sw, %dh, %dw, %input, %kernel, %acc_copy, %result) : (!hal.device, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view) -> ()
  util.return
}

// The same convolution checked as if the stride were 1x1: the sizes do
// not match the result, which must be reported (not read out of bounds).
util.func @f32_wrong_sizes() {
  %c0 = arith.constant 0 : index
  %device = hal.devices.get %c0 : !hal.device
  %n = arith.constant 1 : i64
  %c = arith.constant 2 : i64
  %h = arith.constant 6 : i64
  %w = arith.constant 7 : i64
  %f = arith.constant 3 : i64
  %kh = arith.constant 3 : i64
  %kw = arith.constant 2 : i64
  %one = arith.constant 1 : i64
  %dh = arith.constant 2 : i64
  %f32 = hal.element_type<f32> : i32
  %s1 = arith.constant 5 : i32
  %s2 = arith.constant 6 : i32
  %input = util.call @conv2d_test.generate_random_tensor(%device, %n, %c, %h, %w, %f32, %s1) : (!hal.device, i64, i64, i64, i64, i32, i32) -> !hal.buffer_view
  %kernel = util.call @conv2d_test.generate_random_tensor(%device, %f, %c, %kh, %kw, %f32, %s2) : (!hal.device, i64, i64, i64, i64, i32, i32) -> !hal.buffer_view
  %i = hal.tensor.import %input : !hal.buffer_view -> tensor<1x2x6x7xf32>
  %k = hal.tensor.import %kernel : !hal.buffer_view -> tensor<3x2x3x2xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x3x2x3xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<1x3x2x3xf32>) -> tensor<1x3x2x3xf32>
  %r = linalg.conv_2d_nchw_fchw {dilations = dense<[2, 1]> : tensor<2xi64>, strides = dense<[1, 2]> : tensor<2xi64>}
      ins(%i, %k : tensor<1x2x6x7xf32>, tensor<3x2x3x2xf32>) outs(%z : tensor<1x3x2x3xf32>) -> tensor<1x3x2x3xf32>
  %result = hal.tensor.export %r : tensor<1x3x2x3xf32> -> !hal.buffer_view
  %null = util.null : !hal.buffer_view
  util.call @conv2d_test.check_conv2d_results(%device, %n, %c, %h, %w, %f, %kh, %kw, %one, %one, %dh, %one, %input, %kernel, %null, %result) : (!hal.device, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view, !hal.buffer_view) -> ()
  util.return
}
