// A matmul on one device, and the same matmul split across ranks along the
// contracted dimension (tensor parallel, row-parallel): each rank multiplies
// its columns of A by its rows of B, and an all-reduce sums the partial
// products.
func.func @matmul(%a : tensor<16x64xf32>, %b : tensor<64x24xf32>) -> tensor<16x24xf32> {
  %c = stablehlo.dot %a, %b : (tensor<16x64xf32>, tensor<64x24xf32>) -> tensor<16x24xf32>
  return %c : tensor<16x24xf32>
}

func.func @tp_matmul_2(%a : tensor<16x32xf32>, %b : tensor<32x24xf32>) -> tensor<16x24xf32> {
  %partial = stablehlo.dot %a, %b : (tensor<16x32xf32>, tensor<32x24xf32>) -> tensor<16x24xf32>
  %c = "stablehlo.all_reduce"(%partial) ({
    ^bb0(%x: tensor<f32>, %y: tensor<f32>):
      %s = stablehlo.add %x, %y : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) {channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
        replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
        use_global_device_ids} : (tensor<16x24xf32>) -> tensor<16x24xf32>
  return %c : tensor<16x24xf32>
}

func.func @tp_matmul_4(%a : tensor<16x16xf32>, %b : tensor<16x24xf32>) -> tensor<16x24xf32> {
  %partial = stablehlo.dot %a, %b : (tensor<16x16xf32>, tensor<16x24xf32>) -> tensor<16x24xf32>
  %c = "stablehlo.all_reduce"(%partial) ({
    ^bb0(%x: tensor<f32>, %y: tensor<f32>):
      %s = stablehlo.add %x, %y : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) {channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
        replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>,
        use_global_device_ids} : (tensor<16x24xf32>) -> tensor<16x24xf32>
  return %c : tensor<16x24xf32>
}
