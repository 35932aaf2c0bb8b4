// Output projection: hidden states -> logits over the 256-token vocabulary.
module @head {
  util.global private @w = #flow.parameter.named<"placement"::"head.w"> : tensor<64x256xf32>

  func.func @head(%h: tensor<?x64xf32>) -> tensor<?x256xf32> {
    %w = util.global.load @w : tensor<64x256xf32>
    %c0 = arith.constant 0 : index
    %n = tensor.dim %h, %c0 : tensor<?x64xf32>
    %zero = arith.constant 0.0 : f32
    %e = tensor.empty(%n) : tensor<?x256xf32>
    %f = linalg.fill ins(%zero : f32) outs(%e : tensor<?x256xf32>) -> tensor<?x256xf32>
    %y = linalg.matmul ins(%h, %w : tensor<?x64xf32>, tensor<64x256xf32>)
                       outs(%f : tensor<?x256xf32>) -> tensor<?x256xf32>
    return %y : tensor<?x256xf32>
  }
}
