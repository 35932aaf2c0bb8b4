// Shard "encoder" of graph "autoenc": h = relu(x @ w + b_enc).
// Its VM module is named "autoenc_encoder" (graph name, underscore, shard name) whatever the
// module is called here; the decoder shard calls it by that name.
#map_bias = affine_map<(d0, d1) -> (d1)>
#map_id = affine_map<(d0, d1) -> (d0, d1)>
module @encoder {
  util.global private @w = #flow.parameter.named<"sharded"::"w"> : tensor<16x32xf32>
  util.global private @b_enc = #flow.parameter.named<"sharded"::"b_enc"> : tensor<32xf32>

  func.func @encode(%x: tensor<?x16xf32>) -> tensor<?x32xf32> {
    %w = util.global.load @w : tensor<16x32xf32>
    %b = util.global.load @b_enc : tensor<32xf32>
    %c0 = arith.constant 0 : index
    %n = tensor.dim %x, %c0 : tensor<?x16xf32>
    %zero = arith.constant 0.0 : f32
    %init = tensor.empty(%n) : tensor<?x32xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<?x32xf32>) -> tensor<?x32xf32>
    %mm = linalg.matmul ins(%x, %w : tensor<?x16xf32>, tensor<16x32xf32>)
                        outs(%acc : tensor<?x32xf32>) -> tensor<?x32xf32>
    %h = linalg.generic {indexing_maps = [#map_id, #map_bias, #map_id],
                         iterator_types = ["parallel", "parallel"]}
        ins(%mm, %b : tensor<?x32xf32>, tensor<32xf32>) outs(%init : tensor<?x32xf32>) {
      ^bb0(%a: f32, %bias: f32, %o: f32):
        %s = arith.addf %a, %bias : f32
        %r = arith.maximumf %s, %zero : f32
        linalg.yield %r : f32
    } -> tensor<?x32xf32>
    return %h : tensor<?x32xf32>
  }
}
