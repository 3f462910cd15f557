// Elementwise add of two 100000xf32 vectors: a single dispatch (over 20
// workgroups with the pinned compiler), for the HAL suite's direct
// executable dispatch and its in-flight tests. The executable is taken from
// the compiled module's rodata.
func.func @add(%a: tensor<100000xf32>, %b: tensor<100000xf32>) -> tensor<100000xf32> {
  %0 = arith.addf %a, %b : tensor<100000xf32>
  return %0 : tensor<100000xf32>
}
