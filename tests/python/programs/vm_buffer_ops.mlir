// A function that reads and writes a !vm.buffer passed from the host, for
// the buffer-protocol export tests (compile with --compile-from=vm).
vm.module @vm_buffer_ops {
  // Returns the i32 at element 0 and stores 42 at element 1.
  vm.func @load_store(%buf : !vm.buffer) -> i32 {
    %c0 = vm.const.i64 0
    %c1 = vm.const.i64 1
    %v = vm.buffer.load.i32 %buf[%c0] : !vm.buffer -> i32
    %c42 = vm.const.i32 42
    vm.buffer.store.i32 %c42, %buf[%c1] : i32 -> !vm.buffer
    vm.return %v : i32
  }
  vm.export @load_store
}
