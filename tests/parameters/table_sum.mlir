// s = sum(t * x) over a 40000-element parameter `t` from scope "model"
// (160 KB: several 64 KiB chunks, so a misaligned copy of it that is
// demand-paged is read chunk by chunk by the dispatch).
util.global private @t = #stream.parameter.named<"model"::"t"> : tensor<40000xf32>
func.func @main(%x: tensor<40000xf32>) -> tensor<f32> {
  %t = util.global.load @t : tensor<40000xf32>
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<f32>
  %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<f32>) -> tensor<f32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>, affine_map<(i) -> ()>],
      iterator_types = ["reduction"]}
      ins(%t, %x : tensor<40000xf32>, tensor<40000xf32>) outs(%acc : tensor<f32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %m = arith.mulf %a, %b : f32
      %s = arith.addf %m, %o : f32
      linalg.yield %s : f32
  } -> tensor<f32>
  return %r : tensor<f32>
}
