// Parameters loaded in the initializer and used there by a dispatch
// (issue 24). The compiler hoists w * w into the initializer: it loads w
// and b (io_parameters.load; Ferrite copies file-backed parameters into
// device memory as host work ordered on the queue) and runs the squaring
// dispatch waiting on the load's fence. Before the fix the cuda queue
// skipped that wait as "covered by stream order": the dispatch ran as soon
// as the stream passed the load, before the host had copied w, and read
// the zeroed allocation (affine returned b). scripts/test-gpu.sh writes
// the parameter file (model.w[i] = 1 + 0.5 * (i % 7), model.b[i] =
// 0.25 * (i % 5); every result is exact in f32, fused or not) and compares
// cuda with local-task. 4 MiB per parameter: the host copy takes long
// enough for a dispatch that does not wait to overtake it every time.
util.global private @w = #flow.parameter.named<"model"::"w"> : tensor<1048576xf32>
util.global private @b = #flow.parameter.named<"model"::"b"> : tensor<1048576xf32>

func.func @affine(%x: tensor<1048576xf32>) -> tensor<1048576xf32> {
  %w = util.global.load @w : tensor<1048576xf32>
  %b = util.global.load @b : tensor<1048576xf32>
  %e = tensor.empty() : tensor<1048576xf32>
  %w2 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%w : tensor<1048576xf32>) outs(%e : tensor<1048576xf32>) {
  ^bb0(%a: f32, %o: f32):
    %s = arith.mulf %a, %a : f32
    linalg.yield %s : f32
  } -> tensor<1048576xf32>
  %y = arith.mulf %x, %w2 : tensor<1048576xf32>
  %z = arith.addf %y, %b : tensor<1048576xf32>
  return %z : tensor<1048576xf32>
}
