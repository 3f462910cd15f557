// call.variadic and call.variadic.yieldable need a native import with a
// variadic signature. The hal module's fence.join and fence.await are the ones
// a stock iree-run-module offers; they are called with null fences only, so no
// device work runs. Written in the VM dialect (iree-compile --compile-mode=vm)
// because the compiler records the module's dependency on `hal`, which
// iree-run-module needs to register that module (iree-as-module does not).
vm.module @hal_variadic {
  vm.import private @hal.fence.join(%flags : i64, %fences : !vm.ref<!hal.fence> ...) -> !vm.ref<!hal.fence>
  vm.import private @hal.fence.await(%timeout_millis : i32, %flags : i64, %fences : !vm.ref<!hal.fence> ...) -> i32 attributes {vm.yield}

  vm.export @test_call_variadic_import
  vm.func @test_call_variadic_import() {
    %flags = vm.const.i64.zero
    %null = vm.const.ref.zero : !vm.ref<!hal.fence>
    %joined = vm.call.variadic @hal.fence.join(%flags, [%null, %null]) : (i64, !vm.ref<!hal.fence> ...) -> !vm.ref<!hal.fence>
    %nz = vm.cmp.nz.ref %joined : !vm.ref<!hal.fence>
    vm.cond_fail %nz, "joining two null fences must give a null fence"
    %empty = vm.call.variadic @hal.fence.join(%flags, []) : (i64, !vm.ref<!hal.fence> ...) -> !vm.ref<!hal.fence>
    %nz2 = vm.cmp.nz.ref %empty : !vm.ref<!hal.fence>
    vm.cond_fail %nz2, "joining no fences must give a null fence"
    vm.return
  }

  vm.export @test_call_variadic_yieldable_import
  vm.func @test_call_variadic_yieldable_import() {
    %timeout = vm.const.i32 -1
    %flags = vm.const.i64.zero
    %null = vm.const.ref.zero : !vm.ref<!hal.fence>
    // The import is marked {vm.yield}, so the compiler emits this call as
    // call.variadic.yieldable with a continuation block.
    %status = vm.call.variadic @hal.fence.await(%timeout, %flags, [%null]) : (i32, i64, !vm.ref<!hal.fence> ...) -> i32
    %nz = vm.cmp.nz.i32 %status : i32
    vm.cond_fail %nz, "awaiting only null fences must succeed at once"
    vm.return
  }
}
