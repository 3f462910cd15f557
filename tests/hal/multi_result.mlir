// Several results of different kinds: sum, difference, elementwise product
// of two vectors, their dot product (rank 0), and a scalar i32 passed through
// doubled.
func.func @several(%a: tensor<5xf32>, %b: tensor<5xf32>, %k: i32)
    -> (tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<f32>, i32) {
  %sum = arith.addf %a, %b : tensor<5xf32>
  %diff = arith.subf %a, %b : tensor<5xf32>
  %prod = arith.mulf %a, %b : tensor<5xf32>
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<f32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<f32>) -> tensor<f32>
  %dot = linalg.dot ins(%a, %b : tensor<5xf32>, tensor<5xf32>) outs(%init : tensor<f32>) -> tensor<f32>
  %k2 = arith.addi %k, %k : i32
  return %sum, %diff, %prod, %dot, %k2 : tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<f32>, i32
}
