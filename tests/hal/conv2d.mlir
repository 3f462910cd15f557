// A small NHWC convolution: 1x8x8x3 input, 3x3x3x4 (HWCF) filter, stride 1,
// no padding -> 1x6x6x4.
func.func @conv2d(%input: tensor<1x8x8x3xf32>, %filter: tensor<3x3x3x4xf32>) -> tensor<1x6x6x4xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<1x6x6x4xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<1x6x6x4xf32>) -> tensor<1x6x6x4xf32>
  %0 = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
         ins(%input, %filter : tensor<1x8x8x3xf32>, tensor<3x3x3x4xf32>)
         outs(%init : tensor<1x6x6x4xf32>) -> tensor<1x6x6x4xf32>
  return %0 : tensor<1x6x6x4xf32>
}
