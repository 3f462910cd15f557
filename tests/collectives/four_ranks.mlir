func.func @all_reduce_pairs(%x : tensor<2xi32>) -> tensor<2xi32> {
  %out = "stablehlo.all_reduce"(%x) ({
    ^bb0(%a: tensor<i32>, %b: tensor<i32>):
      %s = stablehlo.add %a, %b : tensor<i32>
      stablehlo.return %s : tensor<i32>
    }) {channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
        replica_groups = dense<[[0, 2], [1, 3]]> : tensor<2x2xi64>,
        use_global_device_ids} : (tensor<2xi32>) -> tensor<2xi32>
  return %out : tensor<2xi32>
}
func.func @open_ring(%x : tensor<2xf32>) -> tensor<2xf32> {
  %out = "stablehlo.collective_permute"(%x) {
        source_target_pairs = dense<[[0, 1], [1, 2], [2, 3]]> : tensor<3x2xi64>,
        channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>} : (tensor<2xf32>) -> tensor<2xf32>
  return %out : tensor<2xf32>
}
