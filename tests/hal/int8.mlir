// Integer program: i8 x i8 matmul accumulated in i32, plus an i32
// elementwise step (multiply by 3, add the bias, arithmetic shift right 1).
func.func @qmatmul(%lhs: tensor<4x8xi8>, %rhs: tensor<8x4xi8>, %bias: tensor<4x4xi32>) -> tensor<4x4xi32> {
  %zero = arith.constant 0 : i32
  %empty = tensor.empty() : tensor<4x4xi32>
  %init = linalg.fill ins(%zero : i32) outs(%empty : tensor<4x4xi32>) -> tensor<4x4xi32>
  %mm = linalg.matmul ins(%lhs, %rhs : tensor<4x8xi8>, tensor<8x4xi8>)
                      outs(%init : tensor<4x4xi32>) -> tensor<4x4xi32>
  %three = arith.constant dense<3> : tensor<4x4xi32>
  %one = arith.constant dense<1> : tensor<4x4xi32>
  %0 = arith.muli %mm, %three : tensor<4x4xi32>
  %1 = arith.addi %0, %bias : tensor<4x4xi32>
  %2 = arith.shrsi %1, %one : tensor<4x4xi32>
  return %2 : tensor<4x4xi32>
}
