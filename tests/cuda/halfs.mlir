// f16, bf16 and i8 elementwise programs for the CPU/GPU differential
// (scripts/test-gpu.sh): each computes in the narrow type and returns it.
func.func @f16_fma(%a: tensor<64xf16>, %b: tensor<64xf16>) -> tensor<64xf16> {
  %0 = arith.mulf %a, %b : tensor<64xf16>
  %1 = arith.addf %0, %a : tensor<64xf16>
  return %1 : tensor<64xf16>
}

func.func @bf16_scale(%a: tensor<?xbf16>, %b: tensor<?xbf16>) -> tensor<?xbf16> {
  %0 = arith.mulf %a, %b : tensor<?xbf16>
  return %0 : tensor<?xbf16>
}

func.func @i8_add(%a: tensor<16xi8>, %b: tensor<16xi8>) -> tensor<16xi8> {
  %0 = arith.addi %a, %b : tensor<16xi8>
  return %0 : tensor<16xi8>
}
