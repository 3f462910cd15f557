// A small MLP: batch 8, 128 -> 256 -> 256 -> 10, ReLU between layers, the
// weights as constants. A few dispatches of a few workgroups each: the
// per-call scheduling cost of a typical small model (the busy-machine
// benchmark, scripts/bench-load.py).
func.func @mlp(%x: tensor<8x128xf32>) -> tensor<8x10xf32> {
  %w1 = arith.constant dense<0.01> : tensor<128x256xf32>
  %w2 = arith.constant dense<0.02> : tensor<256x256xf32>
  %w3 = arith.constant dense<0.03> : tensor<256x10xf32>
  %b1 = arith.constant dense<0.1> : tensor<256xf32>
  %b2 = arith.constant dense<-0.1> : tensor<256xf32>
  %zero = arith.constant 0.0 : f32
  %e1 = tensor.empty() : tensor<8x256xf32>
  %f1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<8x256xf32>) -> tensor<8x256xf32>
  %m1 = linalg.matmul ins(%x, %w1 : tensor<8x128xf32>, tensor<128x256xf32>) outs(%f1 : tensor<8x256xf32>) -> tensor<8x256xf32>
  %h1 = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>, affine_map<(i, j) -> (i, j)>],
                        iterator_types = ["parallel", "parallel"]}
      ins(%m1, %b1 : tensor<8x256xf32>, tensor<256xf32>) outs(%e1 : tensor<8x256xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    %r = arith.maximumf %s, %zero : f32
    linalg.yield %r : f32
  } -> tensor<8x256xf32>
  %m2 = linalg.matmul ins(%h1, %w2 : tensor<8x256xf32>, tensor<256x256xf32>) outs(%f1 : tensor<8x256xf32>) -> tensor<8x256xf32>
  %h2 = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>, affine_map<(i, j) -> (i, j)>],
                        iterator_types = ["parallel", "parallel"]}
      ins(%m2, %b2 : tensor<8x256xf32>, tensor<256xf32>) outs(%e1 : tensor<8x256xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    %r = arith.maximumf %s, %zero : f32
    linalg.yield %r : f32
  } -> tensor<8x256xf32>
  %e3 = tensor.empty() : tensor<8x10xf32>
  %f3 = linalg.fill ins(%zero : f32) outs(%e3 : tensor<8x10xf32>) -> tensor<8x10xf32>
  %m3 = linalg.matmul ins(%h2, %w3 : tensor<8x256xf32>, tensor<256x10xf32>) outs(%f3 : tensor<8x10xf32>) -> tensor<8x10xf32>
  return %m3 : tensor<8x10xf32>
}
