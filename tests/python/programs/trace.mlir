// Traces its input and its result (HalModuleDebugSink receives both).
func.func @double(%x: tensor<4xf32>) -> tensor<4xf32> {
  flow.tensor.trace "input" = [%x : tensor<4xf32>]
  %r = arith.addf %x, %x : tensor<4xf32>
  flow.tensor.trace "result" = [%r : tensor<4xf32>]
  return %r : tensor<4xf32>
}
