// 32x64 * 64x16 f32 matrix multiply.
func.func @matmul(%lhs: tensor<32x64xf32>, %rhs: tensor<64x16xf32>) -> tensor<32x16xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<32x16xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<32x16xf32>) -> tensor<32x16xf32>
  %0 = linalg.matmul ins(%lhs, %rhs : tensor<32x64xf32>, tensor<64x16xf32>)
                     outs(%init : tensor<32x16xf32>) -> tensor<32x16xf32>
  return %0 : tensor<32x16xf32>
}
