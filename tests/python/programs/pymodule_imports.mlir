// A program calling functions of a Python-defined module `pymod` (see test_pymodule.py).
func.func private @pymod.add_one(i32) -> i32
func.func private @pymod.scale(f32, i64) -> (f32, i64)
func.func private @pymod.fail(i32) -> i32
func.func private @pymod.echo(tensor<4xf32>) -> tensor<4xf32>

func.func @square_of_next(%a: i32) -> i32 {
  %0 = call @pymod.add_one(%a) : (i32) -> i32
  %1 = arith.muli %0, %0 : i32
  return %1 : i32
}

func.func @scaled(%x: f32, %n: i64) -> (f32, i64) {
  %0:2 = call @pymod.scale(%x, %n) : (f32, i64) -> (f32, i64)
  return %0#0, %0#1 : f32, i64
}

func.func @failing(%a: i32) -> i32 {
  %0 = call @pymod.fail(%a) : (i32) -> i32
  return %0 : i32
}

func.func @double_echo(%t: tensor<4xf32>) -> tensor<4xf32> {
  %0 = call @pymod.echo(%t) : (tensor<4xf32>) -> tensor<4xf32>
  %1 = arith.addf %0, %0 : tensor<4xf32>
  return %1 : tensor<4xf32>
}
