// A program compiled for two devices (`--iree-hal-target-device=dev_a=local
// --iree-hal-target-device=dev_b=local`): values move between them with
// flow.tensor.transfer, so each device's work waits for the other's.

// a lives on dev_a, b on dev_b: the product is computed on dev_b after a
// moves there, the sum on dev_a after the product moves back.
func.func @main(%a: tensor<4xf32> {iree.abi.affinity = #hal.device.promise<@dev_a>},
                %b: tensor<4xf32> {iree.abi.affinity = #hal.device.promise<@dev_b>})
    -> (tensor<4xf32> {iree.abi.affinity = #hal.device.promise<@dev_a>}) {
  %a_on_b = flow.tensor.transfer %a : tensor<4xf32> to #hal.device.promise<@dev_b>
  %p = arith.mulf %a_on_b, %b : tensor<4xf32>
  %p_on_a = flow.tensor.transfer %p : tensor<4xf32> to #hal.device.promise<@dev_a>
  %s = arith.addf %p_on_a, %a : tensor<4xf32>
  return %s : tensor<4xf32>
}

// Several hops of a larger tensor: ((x * x) on b + x on a) * 2 on b, back
// to a, minus x.
func.func @hops(%x: tensor<8192xf32> {iree.abi.affinity = #hal.device.promise<@dev_a>})
    -> (tensor<8192xf32> {iree.abi.affinity = #hal.device.promise<@dev_a>}) {
  %x_b = flow.tensor.transfer %x : tensor<8192xf32> to #hal.device.promise<@dev_b>
  %sq = arith.mulf %x_b, %x_b : tensor<8192xf32>
  %sq_a = flow.tensor.transfer %sq : tensor<8192xf32> to #hal.device.promise<@dev_a>
  %sum = arith.addf %sq_a, %x : tensor<8192xf32>
  %sum_b = flow.tensor.transfer %sum : tensor<8192xf32> to #hal.device.promise<@dev_b>
  %twice = arith.addf %sum_b, %sum_b : tensor<8192xf32>
  %twice_a = flow.tensor.transfer %twice : tensor<8192xf32> to #hal.device.promise<@dev_a>
  %out = arith.subf %twice_a, %x : tensor<8192xf32>
  return %out : tensor<8192xf32>
}
