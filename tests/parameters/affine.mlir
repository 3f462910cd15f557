// y = x * w + b with `w` and `b` read from the parameter scope "model"
// (run with `--parameters=model=<file>`).
util.global private @w = #stream.parameter.named<"model"::"w"> : tensor<4xf32>
util.global private @b = #stream.parameter.named<"model"::"b"> : tensor<4xf32>
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %w = util.global.load @w : tensor<4xf32>
  %b = util.global.load @b : tensor<4xf32>
  %m = arith.mulf %x, %w : tensor<4xf32>
  %r = arith.addf %m, %b : tensor<4xf32>
  return %r : tensor<4xf32>
}
