// Elementwise add of two 4xf32 vectors: one dispatch of one workgroup, the
// smallest call a device can run (the local-task scheduler's load test).
func.func @add4(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
