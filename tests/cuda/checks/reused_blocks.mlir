// Functions run after each other in one process (`ferrite check-module`),
// so a block one releases is handed to the next as it was (queue
// allocations are not cleared, as upstream). Each result is initialised
// by the program (linalg.fill of the accumulator: a fill command or code
// in the dispatch) before a reduction reads it: `t1`/`t2` leave large
// values in blocks of the sizes `t3` allocates, and `t3` passes only if
// its fills are ordered before the reductions that read them.
// (Replaces stale_outputs.mlir, whose top-k kernel from the pinned
// compiler reads outputs it never initialises: a compiler bug that only
// zeroed allocations hid; see crates/ferrite-hal-cuda/src/diagnostics.rs.)

func.func @t1_large() {
  %v = util.unfoldable_constant dense<[[900.0, 950.0, 910.0, 990.0, 905.0, 915.0], [980.0, 960.0, 970.0, 940.0, 930.0, 920.0]]> : tensor<2x6xf32>
  %e = tensor.empty() : tensor<2xf32>
  %ninf = arith.constant 0xFF800000 : f32
  %zero = arith.constant 0.0 : f32
  %fm = linalg.fill ins(%ninf : f32) outs(%e : tensor<2xf32>) -> tensor<2xf32>
  %fs = linalg.fill ins(%zero : f32) outs(%e : tensor<2xf32>) -> tensor<2xf32>
  %max = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%v : tensor<2x6xf32>) outs(%fm : tensor<2xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %m = arith.maximumf %a, %acc : f32
    linalg.yield %m : f32
  } -> tensor<2xf32>
  %sum = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%v : tensor<2x6xf32>) outs(%fs : tensor<2xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %s = arith.addf %a, %acc : f32
    linalg.yield %s : f32
  } -> tensor<2xf32>
  check.expect_almost_eq_const(%max, dense<[990.0, 980.0]> : tensor<2xf32>) : tensor<2xf32>
  check.expect_almost_eq_const(%sum, dense<[5570.0, 5700.0]> : tensor<2xf32>) : tensor<2xf32>
  return
}

func.func @t2_large() {
  %v = util.unfoldable_constant dense<[[900.0, 950.0, 910.0, 990.0, 905.0, 915.0], [980.0, 960.0, 970.0, 940.0, 930.0, 920.0]]> : tensor<2x6xf32>
  %e = tensor.empty() : tensor<2xf32>
  %ninf = arith.constant 0xFF800000 : f32
  %zero = arith.constant 0.0 : f32
  %fm = linalg.fill ins(%ninf : f32) outs(%e : tensor<2xf32>) -> tensor<2xf32>
  %fs = linalg.fill ins(%zero : f32) outs(%e : tensor<2xf32>) -> tensor<2xf32>
  %max = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%v : tensor<2x6xf32>) outs(%fm : tensor<2xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %m = arith.maximumf %a, %acc : f32
    linalg.yield %m : f32
  } -> tensor<2xf32>
  %sum = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%v : tensor<2x6xf32>) outs(%fs : tensor<2xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %s = arith.addf %a, %acc : f32
    linalg.yield %s : f32
  } -> tensor<2xf32>
  check.expect_almost_eq_const(%max, dense<[990.0, 980.0]> : tensor<2xf32>) : tensor<2xf32>
  check.expect_almost_eq_const(%sum, dense<[5570.0, 5700.0]> : tensor<2xf32>) : tensor<2xf32>
  return
}

func.func @t3_small() {
  %v = util.unfoldable_constant dense<[[0.5, 2.5, 1.5, 4.5, 3.5, 5.5], [9.5, 6.5, 8.5, 7.5, 11.5, 10.5]]> : tensor<2x6xf32>
  %e = tensor.empty() : tensor<2xf32>
  %ninf = arith.constant 0xFF800000 : f32
  %zero = arith.constant 0.0 : f32
  %fm = linalg.fill ins(%ninf : f32) outs(%e : tensor<2xf32>) -> tensor<2xf32>
  %fs = linalg.fill ins(%zero : f32) outs(%e : tensor<2xf32>) -> tensor<2xf32>
  %max = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%v : tensor<2x6xf32>) outs(%fm : tensor<2xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %m = arith.maximumf %a, %acc : f32
    linalg.yield %m : f32
  } -> tensor<2xf32>
  %sum = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%v : tensor<2x6xf32>) outs(%fs : tensor<2xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %s = arith.addf %a, %acc : f32
    linalg.yield %s : f32
  } -> tensor<2xf32>
  check.expect_almost_eq_const(%max, dense<[5.5, 11.5]> : tensor<2xf32>) : tensor<2xf32>
  check.expect_almost_eq_const(%sum, dense<[18.0, 54.0]> : tensor<2xf32>) : tensor<2xf32>
  return
}
