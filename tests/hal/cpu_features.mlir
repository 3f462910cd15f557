// CPU feature queries (`hal.cpu` category, LLVM feature names) as compiled
// programs make them: each result is the device's answer (0 or 1), and for
// a name the device does not know, the query fails and gives the default (7).

util.func @features() -> (i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64) {
  %c0 = arith.constant 0 : index
  %device = hal.devices.get %c0 : !hal.device
  %ok0, %sse3 = hal.device.query<%device : !hal.device> key("hal.cpu" :: "sse3") : i1, i64 = 0 : i64
  %ok1, %sse41 = hal.device.query<%device : !hal.device> key("hal.cpu" :: "sse4.1") : i1, i64 = 0 : i64
  %ok2, %avx = hal.device.query<%device : !hal.device> key("hal.cpu" :: "avx") : i1, i64 = 0 : i64
  %ok3, %fma = hal.device.query<%device : !hal.device> key("hal.cpu" :: "fma") : i1, i64 = 0 : i64
  %ok4, %avx2 = hal.device.query<%device : !hal.device> key("hal.cpu" :: "avx2") : i1, i64 = 0 : i64
  %ok5, %avx512f = hal.device.query<%device : !hal.device> key("hal.cpu" :: "avx512f") : i1, i64 = 0 : i64
  %ok6, %avx512vnni = hal.device.query<%device : !hal.device> key("hal.cpu" :: "avx512vnni") : i1, i64 = 0 : i64
  %ok7, %avx512bf16 = hal.device.query<%device : !hal.device> key("hal.cpu" :: "avx512bf16") : i1, i64 = 0 : i64
  %ok8, %xop = hal.device.query<%device : !hal.device> key("hal.cpu" :: "xop") : i1, i64 = 0 : i64
  %ok9, %amx = hal.device.query<%device : !hal.device> key("hal.cpu" :: "amx-tile") : i1, i64 = 0 : i64
  %okx, %unknown = hal.device.query<%device : !hal.device> key("hal.cpu" :: "not-a-feature") : i1, i64 = 7 : i64
  util.return %sse3, %sse41, %avx, %fma, %avx2, %avx512f, %avx512vnni, %avx512bf16, %xop, %amx, %unknown : i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64
}

// A dispatch, so that loading the module creates an executable.
util.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %r = arith.addf %a, %b : tensor<4xf32>
  util.return %r : tensor<4xf32>
}
