// tensor.empty + linalg.fill: a tensor filled with a runtime scalar, and one
// filled with a constant then offset by the input.
func.func @splat(%v: f32) -> tensor<3x5xf32> {
  %empty = tensor.empty() : tensor<3x5xf32>
  %0 = linalg.fill ins(%v : f32) outs(%empty : tensor<3x5xf32>) -> tensor<3x5xf32>
  return %0 : tensor<3x5xf32>
}

func.func @offset(%x: tensor<6xi32>) -> tensor<6xi32> {
  %seven = arith.constant 7 : i32
  %empty = tensor.empty() : tensor<6xi32>
  %filled = linalg.fill ins(%seven : i32) outs(%empty : tensor<6xi32>) -> tensor<6xi32>
  %0 = arith.addi %filled, %x : tensor<6xi32>
  return %0 : tensor<6xi32>
}
