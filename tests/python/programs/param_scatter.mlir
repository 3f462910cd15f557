// io_parameters.scatter driven from a host call: writes ranges of %src into
// the parameters named by the key table, then waits for the signal fence.
// Written at the VM level (compile with --compile-from=vm) so the test can
// pass the key table and spans as plain byte buffers.
vm.module @scatter_test {
  vm.import private @hal.devices.get(%index : i32) -> !vm.ref<!hal.device>
  vm.import private @hal.fence.create(%device : !vm.ref<!hal.device>, %flags : i64) -> !vm.ref<!hal.fence>
  vm.import private @hal.fence.await(%timeout_millis : i32, %flags : i64, %fences : !vm.ref<!hal.fence> ...) -> i32 attributes {vm.yield}
  vm.import private @io_parameters.scatter(%device : !vm.ref<!hal.device>, %queue_affinity : i64, %wait_fence : !vm.ref<!hal.fence>, %signal_fence : !vm.ref<!hal.fence>, %source_buffer : !vm.ref<!hal.buffer>, %target_scope : !vm.buffer, %key_table : !vm.buffer, %key_data : !vm.buffer, %spans : !vm.buffer)
  vm.func @scatter(%src : !vm.ref<!hal.buffer>, %scope : !vm.buffer, %table : !vm.buffer, %data : !vm.buffer, %spans : !vm.buffer) -> i32 {
    %c0 = vm.const.i32 0
    %dev = vm.call @hal.devices.get(%c0) : (i32) -> !vm.ref<!hal.device>
    %aff = vm.const.i64 -1
    %flags = vm.const.i64 0
    %signal = vm.call @hal.fence.create(%dev, %flags) : (!vm.ref<!hal.device>, i64) -> !vm.ref<!hal.fence>
    %null = vm.const.ref.zero : !vm.ref<!hal.fence>
    vm.call @io_parameters.scatter(%dev, %aff, %null, %signal, %src, %scope, %table, %data, %spans) : (!vm.ref<!hal.device>, i64, !vm.ref<!hal.fence>, !vm.ref<!hal.fence>, !vm.ref<!hal.buffer>, !vm.buffer, !vm.buffer, !vm.buffer, !vm.buffer) -> ()
    %timeout = vm.const.i32 -1
    %st = vm.call.variadic @hal.fence.await(%timeout, %flags, [%signal]) : (i32, i64, !vm.ref<!hal.fence> ...) -> i32
    vm.return %st : i32
  }
  vm.export @scatter
}
