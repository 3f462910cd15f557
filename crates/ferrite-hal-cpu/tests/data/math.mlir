func.func @expsin(%a: tensor<1024xf32>) -> tensor<1024xf32> {
  %0 = math.exp %a : tensor<1024xf32>
  %1 = math.sin %0 : tensor<1024xf32>
  %2 = math.powf %1, %a : tensor<1024xf32>
  return %2 : tensor<1024xf32>
}
