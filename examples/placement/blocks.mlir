// Two residual MLP blocks: h + relu(h @ w1 + b1) @ w2, twice. The matmuls are the work a GPU is
// for; in the example app this graph is placed on the CUDA device.
#row = affine_map<(d0, d1) -> (d0, d1)>
#bias = affine_map<(d0, d1) -> (d1)>
module @blocks {
  util.global private @w1a = #flow.parameter.named<"placement"::"blocks.0.w1"> : tensor<64x128xf32>
  util.global private @b1a = #flow.parameter.named<"placement"::"blocks.0.b1"> : tensor<128xf32>
  util.global private @w2a = #flow.parameter.named<"placement"::"blocks.0.w2"> : tensor<128x64xf32>
  util.global private @w1b = #flow.parameter.named<"placement"::"blocks.1.w1"> : tensor<64x128xf32>
  util.global private @b1b = #flow.parameter.named<"placement"::"blocks.1.b1"> : tensor<128xf32>
  util.global private @w2b = #flow.parameter.named<"placement"::"blocks.1.w2"> : tensor<128x64xf32>

  func.func private @block(%h: tensor<?x64xf32>, %w1: tensor<64x128xf32>, %b1: tensor<128xf32>,
                           %w2: tensor<128x64xf32>) -> tensor<?x64xf32> {
    %c0 = arith.constant 0 : index
    %n = tensor.dim %h, %c0 : tensor<?x64xf32>
    %zero = arith.constant 0.0 : f32
    %e1 = tensor.empty(%n) : tensor<?x128xf32>
    %f1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<?x128xf32>) -> tensor<?x128xf32>
    %m1 = linalg.matmul ins(%h, %w1 : tensor<?x64xf32>, tensor<64x128xf32>)
                        outs(%f1 : tensor<?x128xf32>) -> tensor<?x128xf32>
    %a = linalg.generic {indexing_maps = [#row, #bias, #row], iterator_types = ["parallel", "parallel"]}
        ins(%m1, %b1 : tensor<?x128xf32>, tensor<128xf32>) outs(%e1 : tensor<?x128xf32>) {
      ^bb0(%x: f32, %b: f32, %o: f32):
        %s = arith.addf %x, %b : f32
        %r = arith.maximumf %s, %zero : f32
        linalg.yield %r : f32
    } -> tensor<?x128xf32>
    %e2 = tensor.empty(%n) : tensor<?x64xf32>
    %f2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<?x64xf32>) -> tensor<?x64xf32>
    %m2 = linalg.matmul ins(%a, %w2 : tensor<?x128xf32>, tensor<128x64xf32>)
                        outs(%f2 : tensor<?x64xf32>) -> tensor<?x64xf32>
    %y = linalg.generic {indexing_maps = [#row, #row, #row], iterator_types = ["parallel", "parallel"]}
        ins(%h, %m2 : tensor<?x64xf32>, tensor<?x64xf32>) outs(%e2 : tensor<?x64xf32>) {
      ^bb0(%x: f32, %d: f32, %o: f32):
        %s = arith.addf %x, %d : f32
        linalg.yield %s : f32
    } -> tensor<?x64xf32>
    return %y : tensor<?x64xf32>
  }

  func.func @blocks(%h: tensor<?x64xf32>) -> tensor<?x64xf32> {
    %w1a = util.global.load @w1a : tensor<64x128xf32>
    %b1a = util.global.load @b1a : tensor<128xf32>
    %w2a = util.global.load @w2a : tensor<128x64xf32>
    %w1b = util.global.load @w1b : tensor<64x128xf32>
    %b1b = util.global.load @b1b : tensor<128xf32>
    %w2b = util.global.load @w2b : tensor<128x64xf32>
    %h1 = call @block(%h, %w1a, %b1a, %w2a) : (tensor<?x64xf32>, tensor<64x128xf32>, tensor<128xf32>, tensor<128x64xf32>) -> tensor<?x64xf32>
    %h2 = call @block(%h1, %w1b, %b1b, %w2b) : (tensor<?x64xf32>, tensor<64x128xf32>, tensor<128xf32>, tensor<128x64xf32>) -> tensor<?x64xf32>
    return %h2 : tensor<?x64xf32>
  }
}
