// A dispatch that calls a host function through the executable import table:
// out[i] = host_scale_add(a[i]) for every element, where the host function
// receives a packed parameter struct {a_base, a_offset, out_base, out_offset,
// count, workgroup_id, processor_id}.
module @import_test {
  stream.executable private @ex {
    stream.executable.export public @scale workgroups(%n: index) -> (index, index, index) {
      %x = affine.apply affine_map<()[s0] -> (s0 ceildiv 16)>()[%n]
      %c1 = arith.constant 1 : index
      stream.return %x, %c1, %c1 : index, index, index
    }
    builtin.module {
      func.func private @ferrite_host_scale(%a: memref<f32>, %a_off: index,
          %o: memref<f32>, %o_off: index, %n: index, %wg: index) attributes {
        hal.import.fields = ["processor_id"],
        llvm.bareptr = true
      }
      func.func @scale(%ba: !stream.binding, %bo: !stream.binding, %n: index) {
        %c0 = arith.constant 0 : index
        %wg = stream.dispatch.workgroup.id[0] : index
        %ma = stream.binding.subspan %ba[%c0] : !stream.binding -> memref<?xf32>{%n}
        %mo = stream.binding.subspan %bo[%c0] : !stream.binding -> memref<?xf32>{%n}
        %base_a, %off_a, %sz_a, %st_a = iree_codegen.extract_strided_metadata %ma
            : memref<?xf32> -> memref<f32>, index, index, index
        %base_o, %off_o, %sz_o, %st_o = iree_codegen.extract_strided_metadata %mo
            : memref<?xf32> -> memref<f32>, index, index, index
        func.call @ferrite_host_scale(%base_a, %off_a, %base_o, %off_o, %n, %wg)
            : (memref<f32>, index, memref<f32>, index, index, index) -> ()
        return
      }
    }
  }
  func.func @scale(%a: tensor<?xf32>) -> tensor<?xf32> {
    %c0 = arith.constant 0 : index
    %n = tensor.dim %a, %c0 : tensor<?xf32>
    %0 = flow.dispatch @ex::@scale[%n](%a, %n) : (tensor<?xf32>{%n}, index) -> tensor<?xf32>{%n}
    return %0 : tensor<?xf32>
  }
}
