// Every command-buffer form the pinned compiler emits for CPU programs, in
// programs of our own (crates/ferrite-cli/tests/command_forms.rs checks that
// each form is really in the compiled module, then runs every function on
// both CPU devices, in both module modes and both VM tiers, against upstream):
//   - reusable command buffers recorded once (memoized) and run with a
//     binding table (`hal.device.queue.execute.indirect`);
//   - copies after a dispatch in one command buffer, and fills after one;
//   - several stages (dispatches separated by barriers);
//   - in-place writes into storage initialised from the module's rodata
//     (`util.unfoldable_constant`: a kernel stores into the constant's
//     pages, which must not fault in the default module mode);
//   - one-shot command buffers with direct bindings (dynamic shapes).

// A dispatch writes into a constant's storage in place, then the command
// buffer copies the result out (dispatch, barrier, copies).
func.func @insert_into_constant(%x: tensor<2x3xi32>) -> tensor<6x4xi32> {
  %c = util.unfoldable_constant dense<[
      [0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11],
      [12, 13, 14, 15], [16, 17, 18, 19], [20, 21, 22, 23]]> : tensor<6x4xi32>
  %r = tensor.insert_slice %x into %c[2, 1] [2, 3] [1, 1] : tensor<2x3xi32> into tensor<6x4xi32>
  return %r : tensor<6x4xi32>
}

// A constant-only variant (no arguments): the whole command buffer is
// recorded in the initializer with the constant bound in place.
func.func @insert_constants() -> tensor<4x4xf32> {
  %c = util.unfoldable_constant dense<1.5> : tensor<4x4xf32>
  %s = util.unfoldable_constant dense<[[-1.0, -2.0], [-3.0, -4.0]]> : tensor<2x2xf32>
  %r = tensor.insert_slice %s into %c[1, 1] [2, 2] [1, 1] : tensor<2x2xf32> into tensor<4x4xf32>
  return %r : tensor<4x4xf32>
}

// Padding: a fill of the pad value and a dispatch (or copy) of the interior
// into the same result buffer.
func.func @pad(%x: tensor<3x4xf32>) -> tensor<5x8xf32> {
  %pad = arith.constant -7.5 : f32
  %r = tensor.pad %x low[1, 2] high[1, 2] {
  ^bb0(%i: index, %j: index):
    tensor.yield %pad : f32
  } : tensor<3x4xf32> to tensor<5x8xf32>
  return %r : tensor<5x8xf32>
}

// Concatenation: copies of the operands into one result, after a dispatch
// that computes one of them.
func.func @concat_after_dispatch(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<12xf32> {
  %e = tensor.empty() : tensor<4xf32>
  %s = linalg.generic {
      indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
      iterator_types = ["parallel"]}
      ins(%a, %b : tensor<4xf32>, tensor<4xf32>) outs(%e : tensor<4xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %m = arith.mulf %x, %y : f32
    linalg.yield %m : f32
  } -> tensor<4xf32>
  %r = tensor.concat dim(0) %a, %s, %b : (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<12xf32>
  return %r : tensor<12xf32>
}

// Several stages: a reduction feeding an elementwise op feeding a matmul,
// each its own dispatch separated by barriers.
func.func @stages(%a: tensor<8x16xf32>, %w: tensor<16x4xf32>) -> tensor<8x4xf32> {
  %zero = arith.constant 0.0 : f32
  %e8 = tensor.empty() : tensor<8xf32>
  %z8 = linalg.fill ins(%zero : f32) outs(%e8 : tensor<8xf32>) -> tensor<8xf32>
  %rowsum = linalg.generic {
      indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>],
      iterator_types = ["parallel", "reduction"]}
      ins(%a : tensor<8x16xf32>) outs(%z8 : tensor<8xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %s = arith.addf %x, %acc : f32
    linalg.yield %s : f32
  } -> tensor<8xf32>
  %e = tensor.empty() : tensor<8x16xf32>
  %scaled = linalg.generic {
      indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0, d1)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%a, %rowsum : tensor<8x16xf32>, tensor<8xf32>) outs(%e : tensor<8x16xf32>) {
  ^bb0(%x: f32, %s: f32, %o: f32):
    %d = arith.subf %x, %s : f32
    linalg.yield %d : f32
  } -> tensor<8x16xf32>
  %e84 = tensor.empty() : tensor<8x4xf32>
  %z84 = linalg.fill ins(%zero : f32) outs(%e84 : tensor<8x4xf32>) -> tensor<8x4xf32>
  %m = linalg.matmul ins(%scaled, %w : tensor<8x16xf32>, tensor<16x4xf32>) outs(%z84 : tensor<8x4xf32>) -> tensor<8x4xf32>
  return %m : tensor<8x4xf32>
}

// Dynamic shapes: a one-shot command buffer with direct bindings, a
// dispatch then a copy into a padded result.
func.func @dynamic_pad(%x: tensor<?xf32>) -> tensor<?xf32> {
  %one = arith.constant 1.0 : f32
  %e = arith.constant 2.0 : f32
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?xf32>
  %empty = tensor.empty(%n) : tensor<?xf32>
  %y = linalg.generic {
      indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
      iterator_types = ["parallel"]}
      ins(%x : tensor<?xf32>) outs(%empty : tensor<?xf32>) {
  ^bb0(%v: f32, %o: f32):
    %m = arith.mulf %v, %e : f32
    %a = arith.addf %m, %one : f32
    linalg.yield %a : f32
  } -> tensor<?xf32>
  %r = tensor.pad %y low[3] high[2] {
  ^bb0(%i: index):
    tensor.yield %one : f32
  } : tensor<?xf32> to tensor<?xf32>
  return %r : tensor<?xf32>
}
