// Sum of a 8x16 tensor over axis 1 -> 8 values.
func.func @row_sum(%x: tensor<8x16xf32>) -> tensor<8xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<8xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<8xf32>) -> tensor<8xf32>
  %0 = linalg.reduce ins(%x : tensor<8x16xf32>) outs(%init : tensor<8xf32>) dimensions = [1]
    (%in: f32, %acc: f32) {
      %s = arith.addf %in, %acc : f32
      linalg.yield %s : f32
    }
  return %0 : tensor<8xf32>
}
