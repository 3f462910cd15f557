// Dynamic shapes: elementwise a*b+1 over tensor<?xf32> arguments, and the
// dynamic length's sum of squares as a second function.
func.func @fma1(%a: tensor<?xf32>, %b: tensor<?xf32>) -> tensor<?xf32> {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %a, %c0 : tensor<?xf32>
  %one = arith.constant 1.0 : f32
  %empty = tensor.empty(%n) : tensor<?xf32>
  %0 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]}
      ins(%a, %b : tensor<?xf32>, tensor<?xf32>) outs(%empty : tensor<?xf32>) {
    ^bb0(%x: f32, %y: f32, %out: f32):
      %m = arith.mulf %x, %y : f32
      %r = arith.addf %m, %one : f32
      linalg.yield %r : f32
  } -> tensor<?xf32>
  return %0 : tensor<?xf32>
}

func.func @sum_squares(%a: tensor<?xf32>) -> tensor<f32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<f32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<f32>) -> tensor<f32>
  %0 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> ()>],
                       iterator_types = ["reduction"]}
      ins(%a : tensor<?xf32>) outs(%init : tensor<f32>) {
    ^bb0(%x: f32, %acc: f32):
      %sq = arith.mulf %x, %x : f32
      %r = arith.addf %sq, %acc : f32
      linalg.yield %r : f32
  } -> tensor<f32>
  return %0 : tensor<f32>
}
