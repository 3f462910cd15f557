// Elementwise product of two 32768xf32 vectors: one dispatch over a few
// workgroups (8 with the pinned compiler). The HAL suite keeps several of
// these in flight at once.
func.func @mul(%a: tensor<32768xf32>, %b: tensor<32768xf32>) -> tensor<32768xf32> {
  %0 = arith.mulf %a, %b : tensor<32768xf32>
  return %0 : tensor<32768xf32>
}
