// Kernels that read their output buffer before writing all of it: the
// pinned compiler's cuda code for a 2-row top-k (one workgroup of 64
// threads, every thread doing the whole top-k) fills part of its outputs
// from thread 0 and has the other threads read the rest back without a
// barrier, so what a queue allocation held before shows through. Run with
// `ferrite check-module` after each other in one process: `t1` leaves
// large values in blocks of the size `t3` allocates (t1 and t2 do the same,
// as a released block is reused one or two calls later); `t3` passes
// only if a fresh queue allocation does not show them (issue 24: cuda
// reused the block as it was and returned t1's indices).

func.func @t1_large_rows() {
  %v = util.unfoldable_constant dense<[[50.0, 57.0, 52.0, 59.0, 54.0, 51.0], [61.0, 56.0, 58.0, 53.0, 60.0, 55.0]]> : tensor<2x6xf32>
  %i = util.unfoldable_constant dense<[[20, 21, 22, 23, 24, 25], [26, 27, 28, 29, 30, 31]]> : tensor<2x6xi32>
  %ev = tensor.empty() : tensor<2x3xf32>
  %ei = tensor.empty() : tensor<2x3xi32>
  %ninf = arith.constant 0xFF800000 : f32
  %z = arith.constant 0 : i32
  %fv = linalg.fill ins(%ninf : f32) outs(%ev : tensor<2x3xf32>) -> tensor<2x3xf32>
  %fi = linalg.fill ins(%z : i32) outs(%ei : tensor<2x3xi32>) -> tensor<2x3xi32>
  %r:2 = iree_linalg_ext.topk dimension(1)
      ins(%v, %i : tensor<2x6xf32>, tensor<2x6xi32>)
      outs(%fv, %fi : tensor<2x3xf32>, tensor<2x3xi32>) {
      ^bb0(%a : f32, %b : f32):
        %c = arith.cmpf ogt, %a, %b : f32
        iree_linalg_ext.yield %c : i1
      } -> tensor<2x3xf32>, tensor<2x3xi32>
  check.expect_almost_eq_const(%r#0, dense<[[59.0, 57.0, 54.0], [61.0, 60.0, 58.0]]> : tensor<2x3xf32>) : tensor<2x3xf32>
  check.expect_eq_const(%r#1, dense<[[23, 21, 24], [26, 30, 28]]> : tensor<2x3xi32>) : tensor<2x3xi32>
  return
}

func.func @t2_large_rows() {
  %v = util.unfoldable_constant dense<[[50.0, 57.0, 52.0, 59.0, 54.0, 51.0], [61.0, 56.0, 58.0, 53.0, 60.0, 55.0]]> : tensor<2x6xf32>
  %i = util.unfoldable_constant dense<[[20, 21, 22, 23, 24, 25], [26, 27, 28, 29, 30, 31]]> : tensor<2x6xi32>
  %ev = tensor.empty() : tensor<2x3xf32>
  %ei = tensor.empty() : tensor<2x3xi32>
  %ninf = arith.constant 0xFF800000 : f32
  %z = arith.constant 0 : i32
  %fv = linalg.fill ins(%ninf : f32) outs(%ev : tensor<2x3xf32>) -> tensor<2x3xf32>
  %fi = linalg.fill ins(%z : i32) outs(%ei : tensor<2x3xi32>) -> tensor<2x3xi32>
  %r:2 = iree_linalg_ext.topk dimension(1)
      ins(%v, %i : tensor<2x6xf32>, tensor<2x6xi32>)
      outs(%fv, %fi : tensor<2x3xf32>, tensor<2x3xi32>) {
      ^bb0(%a : f32, %b : f32):
        %c = arith.cmpf ogt, %a, %b : f32
        iree_linalg_ext.yield %c : i1
      } -> tensor<2x3xf32>, tensor<2x3xi32>
  check.expect_almost_eq_const(%r#0, dense<[[59.0, 57.0, 54.0], [61.0, 60.0, 58.0]]> : tensor<2x3xf32>) : tensor<2x3xf32>
  check.expect_eq_const(%r#1, dense<[[23, 21, 24], [26, 30, 28]]> : tensor<2x3xi32>) : tensor<2x3xi32>
  return
}

func.func @t3_small_rows() {
  %v = util.unfoldable_constant dense<[[0.5, 2.5, 1.5, 4.5, 3.5, 5.5], [9.5, 6.5, 8.5, 7.5, 11.5, 10.5]]> : tensor<2x6xf32>
  %i = util.unfoldable_constant dense<[[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]> : tensor<2x6xi32>
  %ev = tensor.empty() : tensor<2x3xf32>
  %ei = tensor.empty() : tensor<2x3xi32>
  %ninf = arith.constant 0xFF800000 : f32
  %z = arith.constant 0 : i32
  %fv = linalg.fill ins(%ninf : f32) outs(%ev : tensor<2x3xf32>) -> tensor<2x3xf32>
  %fi = linalg.fill ins(%z : i32) outs(%ei : tensor<2x3xi32>) -> tensor<2x3xi32>
  %r:2 = iree_linalg_ext.topk dimension(1)
      ins(%v, %i : tensor<2x6xf32>, tensor<2x6xi32>)
      outs(%fv, %fi : tensor<2x3xf32>, tensor<2x3xi32>) {
      ^bb0(%a : f32, %b : f32):
        %c = arith.cmpf ogt, %a, %b : f32
        iree_linalg_ext.yield %c : i1
      } -> tensor<2x3xf32>, tensor<2x3xi32>
  check.expect_almost_eq_const(%r#0, dense<[[5.5, 4.5, 3.5], [11.5, 10.5, 9.5]]> : tensor<2x3xf32>) : tensor<2x3xf32>
  check.expect_eq_const(%r#1, dense<[[5, 3, 4], [10, 11, 6]]> : tensor<2x3xi32>) : tensor<2x3xi32>
  return
}
