// A two-layer MLP with a dynamic batch, written in linalg. Its weights are named parameters
// (scope "mlp"), bound at build time to the tensors of params.safetensors.
#map_bias = affine_map<(d0, d1) -> (d1)>
#map_id = affine_map<(d0, d1) -> (d0, d1)>
module @mlp {
  util.global private @w1 = #flow.parameter.named<"mlp"::"w1"> : tensor<16x32xf32>
  util.global private @b1 = #flow.parameter.named<"mlp"::"b1"> : tensor<32xf32>
  util.global private @w2 = #flow.parameter.named<"mlp"::"w2"> : tensor<32x8xf32>
  util.global private @b2 = #flow.parameter.named<"mlp"::"b2"> : tensor<8xf32>

  // relu(x @ w1 + b1)
  func.func @hidden(%x: tensor<?x16xf32>) -> tensor<?x32xf32> {
    %w1 = util.global.load @w1 : tensor<16x32xf32>
    %b1 = util.global.load @b1 : tensor<32xf32>
    %c0 = arith.constant 0 : index
    %n = tensor.dim %x, %c0 : tensor<?x16xf32>
    %zero = arith.constant 0.0 : f32
    %init = tensor.empty(%n) : tensor<?x32xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<?x32xf32>) -> tensor<?x32xf32>
    %mm = linalg.matmul ins(%x, %w1 : tensor<?x16xf32>, tensor<16x32xf32>)
                        outs(%acc : tensor<?x32xf32>) -> tensor<?x32xf32>
    %h = linalg.generic {indexing_maps = [#map_id, #map_bias, #map_id],
                         iterator_types = ["parallel", "parallel"]}
        ins(%mm, %b1 : tensor<?x32xf32>, tensor<32xf32>) outs(%init : tensor<?x32xf32>) {
      ^bb0(%a: f32, %b: f32, %o: f32):
        %s = arith.addf %a, %b : f32
        %r = arith.maximumf %s, %zero : f32
        linalg.yield %r : f32
    } -> tensor<?x32xf32>
    return %h : tensor<?x32xf32>
  }

  // hidden(x) @ w2 + b2
  func.func @forward(%x: tensor<?x16xf32>) -> tensor<?x8xf32> {
    %h = call @hidden(%x) : (tensor<?x16xf32>) -> tensor<?x32xf32>
    %w2 = util.global.load @w2 : tensor<32x8xf32>
    %b2 = util.global.load @b2 : tensor<8xf32>
    %c0 = arith.constant 0 : index
    %n = tensor.dim %x, %c0 : tensor<?x16xf32>
    %zero = arith.constant 0.0 : f32
    %init = tensor.empty(%n) : tensor<?x8xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<?x8xf32>) -> tensor<?x8xf32>
    %mm = linalg.matmul ins(%h, %w2 : tensor<?x32xf32>, tensor<32x8xf32>)
                        outs(%acc : tensor<?x8xf32>) -> tensor<?x8xf32>
    %y = linalg.generic {indexing_maps = [#map_id, #map_bias, #map_id],
                         iterator_types = ["parallel", "parallel"]}
        ins(%mm, %b2 : tensor<?x8xf32>, tensor<8xf32>) outs(%init : tensor<?x8xf32>) {
      ^bb0(%a: f32, %b: f32, %o: f32):
        %s = arith.addf %a, %b : f32
        linalg.yield %s : f32
    } -> tensor<?x8xf32>
    return %y : tensor<?x8xf32>
  }
}
