func.func @all_reduce_sum(%x : tensor<4xf32>) -> tensor<4xf32> {
  %out = "stablehlo.all_reduce"(%x) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) {channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
        replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
        use_global_device_ids} : (tensor<4xf32>) -> tensor<4xf32>
  return %out : tensor<4xf32>
}
func.func @all_reduce_max_singletons(%x : tensor<3xi32>) -> tensor<3xi32> {
  %out = "stablehlo.all_reduce"(%x) ({
    ^bb0(%a: tensor<i32>, %b: tensor<i32>):
      %s = stablehlo.maximum %a, %b : tensor<i32>
      stablehlo.return %s : tensor<i32>
    }) {channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
        replica_groups = dense<[[0], [1]]> : tensor<2x1xi64>,
        use_global_device_ids} : (tensor<3xi32>) -> tensor<3xi32>
  return %out : tensor<3xi32>
}
func.func @all_gather_dim1(%x : tensor<2x2xf32>) -> tensor<2x4xf32> {
  %out = "stablehlo.all_gather"(%x) {all_gather_dim = 1 : i64,
     channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
     replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
     use_global_device_ids} : (tensor<2x2xf32>) -> tensor<2x4xf32>
  return %out : tensor<2x4xf32>
}
func.func @reduce_scatter_dim0(%x : tensor<4x2xf32>) -> tensor<2x2xf32> {
  %out = "stablehlo.reduce_scatter"(%x) ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) {scatter_dimension = 0 : i64,
      channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
      replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
      use_global_device_ids} : (tensor<4x2xf32>) -> tensor<2x2xf32>
  return %out : tensor<2x2xf32>
}
func.func @all_to_all(%x : tensor<4xf32>) -> tensor<4xf32> {
  %out = "stablehlo.all_to_all"(%x) {
     split_dimension = 0 : i64,
     concat_dimension = 0 : i64,
     split_count = 2 : i64,
     channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
     replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<4xf32>) -> tensor<4xf32>
  return %out : tensor<4xf32>
}
func.func @swap(%x : tensor<3xf32>) -> tensor<3xf32> {
  %out = "stablehlo.collective_permute"(%x) {
        source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>,
        channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>} : (tensor<3xf32>) -> tensor<3xf32>
  return %out : tensor<3xf32>
}
func.func @replica_id() -> tensor<ui32> {
  %id = stablehlo.replica_id : tensor<ui32>
  return %id : tensor<ui32>
}
// Compute around collectives, and two independent collectives in one
// function (one command buffer): every rank must run them in one order.
func.func @compute_around(%x : tensor<4xf32>) -> (tensor<4xf32>, tensor<8xf32>) {
  %sq = stablehlo.multiply %x, %x : tensor<4xf32>
  %sum = "stablehlo.all_reduce"(%sq) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) {channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
        replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
        use_global_device_ids} : (tensor<4xf32>) -> tensor<4xf32>
  %out = stablehlo.add %sum, %x : tensor<4xf32>
  %tripled = stablehlo.add %x, %sq : tensor<4xf32>
  %gathered = "stablehlo.all_gather"(%tripled) {all_gather_dim = 0 : i64,
     channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>,
     replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
     use_global_device_ids} : (tensor<4xf32>) -> tensor<8xf32>
  return %out, %gathered : tensor<4xf32>, tensor<8xf32>
}
