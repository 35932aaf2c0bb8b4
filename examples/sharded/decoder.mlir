// Shard "decoder" of graph "autoenc": y = h @ transpose(w) + b_dec, with the encoder's weight w
// (tied weights: both shards read parameter sharded::w, which the .mln stores once).
// `forward` calls the encoder shard's module across the VM context: the declaration below
// makes "autoenc_encoder" an import of this module, so it must be registered first (the build
// orders modules by these imports).
#map_x = affine_map<(n, o, k) -> (n, k)>
#map_wt = affine_map<(n, o, k) -> (o, k)>
#map_out = affine_map<(n, o, k) -> (n, o)>
#map_bias = affine_map<(d0, d1) -> (d1)>
#map_id = affine_map<(d0, d1) -> (d0, d1)>
module @decoder {
  util.global private @w = #flow.parameter.named<"sharded"::"w"> : tensor<16x32xf32>
  util.global private @b_dec = #flow.parameter.named<"sharded"::"b_dec"> : tensor<16xf32>

  func.func private @autoenc_encoder.encode(tensor<?x16xf32>) -> tensor<?x32xf32>

  func.func @decode(%h: tensor<?x32xf32>) -> tensor<?x16xf32> {
    %w = util.global.load @w : tensor<16x32xf32>
    %b = util.global.load @b_dec : tensor<16xf32>
    %c0 = arith.constant 0 : index
    %n = tensor.dim %h, %c0 : tensor<?x32xf32>
    %zero = arith.constant 0.0 : f32
    %init = tensor.empty(%n) : tensor<?x16xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<?x16xf32>) -> tensor<?x16xf32>
    %mm = linalg.generic {indexing_maps = [#map_x, #map_wt, #map_out],
                          iterator_types = ["parallel", "parallel", "reduction"]}
        ins(%h, %w : tensor<?x32xf32>, tensor<16x32xf32>) outs(%acc : tensor<?x16xf32>) {
      ^bb0(%a: f32, %b2: f32, %o: f32):
        %p = arith.mulf %a, %b2 : f32
        %s = arith.addf %o, %p : f32
        linalg.yield %s : f32
    } -> tensor<?x16xf32>
    %y = linalg.generic {indexing_maps = [#map_id, #map_bias, #map_id],
                         iterator_types = ["parallel", "parallel"]}
        ins(%mm, %b : tensor<?x16xf32>, tensor<16xf32>) outs(%init : tensor<?x16xf32>) {
      ^bb0(%a: f32, %bias: f32, %o: f32):
        %s = arith.addf %a, %bias : f32
        linalg.yield %s : f32
    } -> tensor<?x16xf32>
    return %y : tensor<?x16xf32>
  }

  // decode(encode(x)), the encoder running in its own module.
  func.func @forward(%x: tensor<?x16xf32>) -> tensor<?x16xf32> {
    %h = call @autoenc_encoder.encode(%x) : (tensor<?x16xf32>) -> tensor<?x32xf32>
    %y = call @decode(%h) : (tensor<?x32xf32>) -> tensor<?x16xf32>
    return %y : tensor<?x16xf32>
  }
}
