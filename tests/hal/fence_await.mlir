// Awaits one fence through the hal module's `fence.await` import, returning
// its i32 status (0, or DEADLINE_EXCEEDED as a value on timeout). Written in
// the VM dialect (iree-compile --compile-mode=vm) so the module records its
// dependency on `hal`. The HAL suite (crates/ferrite-hal-cpu/tests) calls it
// in the hal module's asynchronous (yielding) and synchronous modes.
vm.module @fence_await {
  vm.import private @hal.fence.await(%timeout_millis : i32, %flags : i64, %fences : !vm.ref<!hal.fence> ...) -> i32 attributes {vm.yield}

  vm.export @await_one
  vm.func @await_one(%fence : !vm.ref<!hal.fence>, %timeout_millis : i32) -> i32 {
    %flags = vm.const.i64.zero
    %status = vm.call.variadic @hal.fence.await(%timeout_millis, %flags, [%fence]) : (i32, i64, !vm.ref<!hal.fence> ...) -> i32
    vm.return %status : i32
  }

  // Awaits two fences at once, then adds 1000 to the status so a caller can
  // tell the continuation after the yield ran.
  vm.export @await_two
  vm.func @await_two(%a : !vm.ref<!hal.fence>, %b : !vm.ref<!hal.fence>, %timeout_millis : i32) -> i32 {
    %flags = vm.const.i64.zero
    %status = vm.call.variadic @hal.fence.await(%timeout_millis, %flags, [%a, %b]) : (i32, i64, !vm.ref<!hal.fence> ...) -> i32
    %k = vm.const.i32 1000
    %r = vm.add.i32 %status, %k : i32
    vm.return %r : i32
  }
}
