// A chain of elementwise ops: ((a * b + a) - 0.5) / 2, then max with b,
// negated and added to exp(-|a|).
func.func @chain(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %half = arith.constant dense<0.5> : tensor<4x8xf32>
  %two = arith.constant dense<2.0> : tensor<4x8xf32>
  %0 = arith.mulf %a, %b : tensor<4x8xf32>
  %1 = arith.addf %0, %a : tensor<4x8xf32>
  %2 = arith.subf %1, %half : tensor<4x8xf32>
  %3 = arith.divf %2, %two : tensor<4x8xf32>
  %4 = arith.maximumf %3, %b : tensor<4x8xf32>
  %5 = arith.negf %4 : tensor<4x8xf32>
  %6 = math.absf %a : tensor<4x8xf32>
  %7 = arith.negf %6 : tensor<4x8xf32>
  %8 = math.exp %7 : tensor<4x8xf32>
  %9 = arith.addf %5, %8 : tensor<4x8xf32>
  return %9 : tensor<4x8xf32>
}
