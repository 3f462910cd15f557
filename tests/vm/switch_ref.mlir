// switch.ref (core opcode 33), which iree-as-module cannot emit (its generic
// encoder rejects a result on an instruction with variadic operands), written
// in the VM dialect and compiled with iree-compile --compile-mode=vm.
// The index comes from a mutable global so that the compiler cannot fold the
// switch away.
vm.module @switch_ref {
  vm.global.i32 private mutable @index : i32
  vm.rodata private @first dense<[1, 2, 3]> : tensor<3xi8>
  vm.rodata private @second dense<[4, 5, 6, 7]> : tensor<4xi8>

  vm.func private @pick(%i: i32) -> !vm.buffer {
    %a = vm.const.ref.rodata @first : !vm.buffer
    %b = vm.const.ref.rodata @second : !vm.buffer
    %none = vm.const.ref.zero : !vm.buffer
    %r = vm.switch.ref %i[%a, %b] else %none : !vm.buffer
    vm.return %r : !vm.buffer
  }

  vm.export @test_switch_ref
  vm.func @test_switch_ref() {
    %c1 = vm.const.i32 1
    vm.global.store.i32 %c1, @index : i32
    %i1 = vm.global.load.i32 @index : i32
    %r1 = vm.call @pick(%i1) : (i32) -> !vm.buffer
    %len1 = vm.buffer.length %r1 : !vm.buffer -> i64
    %c4 = vm.const.i64 4
    %ne1 = vm.cmp.ne.i64 %len1, %c4 : i64
    vm.cond_fail %ne1, "switch.ref index 1 must pick the 4-byte buffer"

    %c0 = vm.const.i32 0
    vm.global.store.i32 %c0, @index : i32
    %i0 = vm.global.load.i32 @index : i32
    %r0 = vm.call @pick(%i0) : (i32) -> !vm.buffer
    %len0 = vm.buffer.length %r0 : !vm.buffer -> i64
    %c3 = vm.const.i64 3
    %ne0 = vm.cmp.ne.i64 %len0, %c3 : i64
    vm.cond_fail %ne0, "switch.ref index 0 must pick the 3-byte buffer"

    %c7 = vm.const.i32 7
    vm.global.store.i32 %c7, @index : i32
    %i7 = vm.global.load.i32 @index : i32
    %r7 = vm.call @pick(%i7) : (i32) -> !vm.buffer
    %nz = vm.cmp.nz.ref %r7 : !vm.buffer
    vm.cond_fail %nz, "switch.ref out-of-range index must pick the (null) default"
    vm.return
  }
}
