// Functions described by the legacy `iree.abi` JSON reflection (as frontends
// that predate `iree.abi.declaration` emitted it), for ReflectionInvoker
// tests: ndarray and scalar arguments, a keyword argument, inlined results
// and a structured (list) argument.
func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> attributes {
  iree.reflection = {iree.abi = "{\22a\22: [[\22ndarray\22, \22f32\22, 1, 4], [\22named\22, \22b\22, [\22ndarray\22, \22f32\22, 1, 4]]], \22r\22: [[\22ndarray\22, \22f32\22, 1, 4]], \22v\22: 1}"}
} {
  %0 = arith.addf %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}

func.func @scalars(%x: i32, %y: f32) -> (i32, f32) attributes {
  iree.reflection = {iree.abi = "{\22a\22: [\22i32\22, \22f32\22], \22r\22: [[\22stuple\22, \22i32\22, \22f32\22]], \22v\22: 1}"}
} {
  %c = arith.constant 2 : i32
  %0 = arith.muli %x, %c : i32
  %h = arith.constant 0.5 : f32
  %1 = arith.mulf %y, %h : f32
  return %0, %1 : i32, f32
}

func.func @unpair(%l: !util.list<?>) -> (!hal.buffer_view, i32) attributes {
  iree.reflection = {iree.abi = "{\22a\22: [[\22sdict\22, [\22x\22, [\22ndarray\22, \22i32\22, 1, 2]], [\22y\22, \22i32\22]]], \22r\22: [[\22ndarray\22, \22i32\22, 1, 2], \22i32\22], \22v\22: 1}"}
} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %0 = util.list.get %l[%c0] : !util.list<?> -> !hal.buffer_view
  %1 = util.list.get %l[%c1] : !util.list<?> -> i32
  return %0, %1 : !hal.buffer_view, i32
}

func.func @flag(%x: tensor<3xi8>) -> tensor<3xi8> attributes {
  iree.reflection = {iree.abi = "{\22a\22: [[\22ndarray\22, \22i8\22, 1, 3]], \22r\22: [[\22ndarray\22, \22i1\22, 1, 3]], \22v\22: 1}"}
} {
  return %x : tensor<3xi8>
}
