// Two arguments copied side by side into one result and a splat result:
// a command buffer of transfers only (two copies, a fill, a barrier), for
// the profile bundle tests (crates/ferrite-cli/tests/ireeprof.rs).
func.func @copies_and_fill(%a: tensor<64xf32>, %b: tensor<64xf32>) -> (tensor<128xf32>, tensor<256xf32>) {
  %three = arith.constant 3.0 : f32
  %e = tensor.empty() : tensor<128xf32>
  %i0 = tensor.insert_slice %a into %e[0] [64] [1] : tensor<64xf32> into tensor<128xf32>
  %i1 = tensor.insert_slice %b into %i0[64] [64] [1] : tensor<64xf32> into tensor<128xf32>
  %s = tensor.splat %three : tensor<256xf32>
  return %i1, %s : tensor<128xf32>, tensor<256xf32>
}
