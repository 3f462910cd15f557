// VM-bound benchmark as the compiler emits it: a 64-bit LCG loop with a
// data-dependent branch and block arguments, compiled from this MLIR by the
// pinned iree-compile (the scalar function lowers to plain VM bytecode).
func.func @lcg(%n: i64) -> i64 {
  %c0 = arith.constant 0 : i64
  %c1 = arith.constant 1 : i64
  %mul = arith.constant 6364136223846793005 : i64
  %inc = arith.constant 1442695040888963407 : i64
  %c33 = arith.constant 33 : i64
  %seed = arith.constant 42 : i64
  cf.br ^loop(%c0, %seed, %c0 : i64, i64, i64)
^loop(%i: i64, %s: i64, %acc: i64):
  %done = arith.cmpi sge, %i, %n : i64
  cf.cond_br %done, ^exit(%acc : i64), ^body
^body:
  %s1 = arith.muli %s, %mul : i64
  %s2 = arith.addi %s1, %inc : i64
  %hi = arith.shrui %s2, %c33 : i64
  %bit = arith.andi %hi, %c1 : i64
  %odd = arith.cmpi ne, %bit, %c0 : i64
  %i1 = arith.addi %i, %c1 : i64
  cf.cond_br %odd, ^odd, ^even
^odd:
  %a1 = arith.addi %acc, %hi : i64
  cf.br ^loop(%i1, %s2, %a1 : i64, i64, i64)
^even:
  %a2 = arith.xori %acc, %hi : i64
  cf.br ^loop(%i1, %s2, %a2 : i64, i64, i64)
^exit(%r: i64):
  return %r : i64
}
