// y = a * x + y over 256 floats, for the tests of calls as futures
// (crates/ferrite/tests/async_calls*.rs): compiled once with
// --iree-execution-model=async-external (the function then takes a wait and
// a signal fence after its arguments) and once with the default model.
func.func @axpy(%a: f32, %x: tensor<256xf32>, %y: tensor<256xf32>) -> tensor<256xf32> {
  %init = tensor.empty() : tensor<256xf32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
      iterator_types = ["parallel"]}
      ins(%x, %y : tensor<256xf32>, tensor<256xf32>) outs(%init : tensor<256xf32>) {
    ^bb0(%xi: f32, %yi: f32, %o: f32):
      %m = arith.mulf %a, %xi : f32
      %s = arith.addf %m, %yi : f32
      linalg.yield %s : f32
  } -> tensor<256xf32>
  return %r : tensor<256xf32>
}
