// Compiled with --iree-execution-model=async-external: callers pass a wait
// fence and a signal fence after the tensor arguments.
func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %r = arith.addf %a, %b : tensor<4xf32>
  return %r : tensor<4xf32>
}
