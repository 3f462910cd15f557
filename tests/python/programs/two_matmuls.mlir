// Two dependent matrix multiplies: two dispatches the compiler cannot fuse,
// for the execution-trace tests (tests/python/test_exec_trace.py).
func.func @two_matmuls(%a: tensor<32x64xf32>, %b: tensor<64x16xf32>, %c: tensor<16x8xf32>) -> tensor<32x8xf32> {
  %zero = arith.constant 0.0 : f32
  %e0 = tensor.empty() : tensor<32x16xf32>
  %i0 = linalg.fill ins(%zero : f32) outs(%e0 : tensor<32x16xf32>) -> tensor<32x16xf32>
  %ab = linalg.matmul ins(%a, %b : tensor<32x64xf32>, tensor<64x16xf32>)
                      outs(%i0 : tensor<32x16xf32>) -> tensor<32x16xf32>
  %e1 = tensor.empty() : tensor<32x8xf32>
  %i1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<32x8xf32>) -> tensor<32x8xf32>
  %abc = linalg.matmul ins(%ab, %c : tensor<32x16xf32>, tensor<16x8xf32>)
                       outs(%i1 : tensor<32x8xf32>) -> tensor<32x8xf32>
  return %abc : tensor<32x8xf32>
}
