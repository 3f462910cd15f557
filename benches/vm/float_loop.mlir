// VM-bound benchmark in floating point: the logistic map x <- r*x*(1-x) in
// f32 with a data-dependent branch (add or subtract the new x), as the
// pinned iree-compile lowers it (ext_f32 ops, block arguments).
func.func @float_loop(%n: i32) -> f32 {
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %x0 = arith.constant 0.3 : f32
  %r = arith.constant 3.7 : f32
  %one = arith.constant 1.0 : f32
  %half = arith.constant 0.5 : f32
  %zero = arith.constant 0.0 : f32
  cf.br ^loop(%c0, %x0, %zero : i32, f32, f32)
^loop(%i: i32, %x: f32, %acc: f32):
  %done = arith.cmpi sge, %i, %n : i32
  cf.cond_br %done, ^exit(%acc : f32), ^body
^body:
  %omx = arith.subf %one, %x : f32
  %rx = arith.mulf %r, %x : f32
  %x1 = arith.mulf %rx, %omx : f32
  %i1 = arith.addi %i, %c1 : i32
  %big = arith.cmpf ogt, %x1, %half : f32
  cf.cond_br %big, ^hi, ^lo
^hi:
  %a1 = arith.addf %acc, %x1 : f32
  cf.br ^loop(%i1, %x1, %a1 : i32, f32, f32)
^lo:
  %a2 = arith.subf %acc, %x1 : f32
  cf.br ^loop(%i1, %x1, %a2 : i32, f32, f32)
^exit(%res: f32):
  return %res : f32
}
