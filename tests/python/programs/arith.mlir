// Small programs for the Python tests: a tensor add, scalar math, several results.
func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}

func.func @mul_i32(%a: i32, %b: i32) -> i32 {
  %0 = arith.muli %a, %b : i32
  return %0 : i32
}

func.func @scale(%a: tensor<2x3xi32>, %s: tensor<i32>) -> (tensor<2x3xi32>, tensor<2x3xi32>) {
  %b = tensor.empty() : tensor<2x3xi32>
  %0 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> ()>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%a, %s : tensor<2x3xi32>, tensor<i32>) outs(%b : tensor<2x3xi32>) {
  ^bb0(%x: i32, %y: i32, %o: i32):
    %m = arith.muli %x, %y : i32
    linalg.yield %m : i32
  } -> tensor<2x3xi32>
  %1 = arith.addi %a, %0 : tensor<2x3xi32>
  return %0, %1 : tensor<2x3xi32>, tensor<2x3xi32>
}

func.func @dyn(%a: tensor<?xf32>) -> tensor<?xf32> {
  %0 = arith.mulf %a, %a : tensor<?xf32>
  return %0 : tensor<?xf32>
}
