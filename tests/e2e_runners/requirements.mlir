// A module requiring a CPU feature no CPU has (as the generators'
// `--requirements` write it): the runner must not run its test, which
// would fail.

builtin.module @calls attributes {
  iree.reflection = {target_features = "sse3,not-a-feature"}
} {
  util.func private @matmul_test.generate_random_matrix(!hal.device, i64, i64, i32, i32) -> !hal.buffer_view
  util.func @would_fail() {
    %c0 = arith.constant 0 : index
    %device = hal.devices.get %c0 : !hal.device
    %d = arith.constant -1 : i64
    %f32 = hal.element_type<f32> : i32
    %s = arith.constant 1 : i32
    %m = util.call @matmul_test.generate_random_matrix(%device, %d, %d, %f32, %s) : (!hal.device, i64, i64, i32, i32) -> !hal.buffer_view
    util.return
  }
}
