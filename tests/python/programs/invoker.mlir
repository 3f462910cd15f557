// Functions for FunctionInvoker tests: static and dynamic tensors, scalars,
// lists, a reduction and an identity (whose result is its input buffer).
func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}

func.func @scale(%a: tensor<?x3xi32>, %k: i32) -> tensor<?x3xi32> {
  %c0 = arith.constant 0 : index
  %d = tensor.dim %a, %c0 : tensor<?x3xi32>
  %e = tensor.empty(%d) : tensor<?x3xi32>
  %0 = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<?x3xi32>) outs(%e : tensor<?x3xi32>) {
    ^bb0(%x: i32, %o: i32):
      %m = arith.muli %x, %k : i32
      linalg.yield %m : i32
  } -> tensor<?x3xi32>
  return %0 : tensor<?x3xi32>
}

func.func @sum(%a: tensor<?xf32>) -> tensor<f32> {
  %init = arith.constant dense<0.0> : tensor<f32>
  %0 = linalg.reduce ins(%a : tensor<?xf32>) outs(%init : tensor<f32>) dimensions = [0]
    (%x: f32, %acc: f32) {
      %s = arith.addf %x, %acc : f32
      linalg.yield %s : f32
    }
  return %0 : tensor<f32>
}

func.func @scalars(%a: i32, %b: f32) -> (i32, f32) {
  %0 = arith.addi %a, %a : i32
  %1 = arith.mulf %b, %b : f32
  return %0, %1 : i32, f32
}

func.func @echo(%a: tensor<?x?xf32>) -> tensor<?x?xf32> {
  return %a : tensor<?x?xf32>
}

func.func @echo_list(%a: !util.list<?>) -> !util.list<?> {
  return %a : !util.list<?>
}

func.func @add_into(%a: tensor<4xf32>, %out: tensor<4xf32> {iree.abi.output = 0 : index}) -> tensor<4xf32> {
  %0 = arith.addf %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}

func.func @echo_bf16(%a: tensor<?xbf16>) -> tensor<?xbf16> {
  return %a : tensor<?xbf16>
}
