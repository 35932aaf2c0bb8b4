// Embedding lookup: token ids -> rows of a [256, 64] table (a named parameter).
// A gather is memory-bound and tiny; in the example app it stays on the CPU.
#ids = affine_map<(d0, d1) -> (d0)>
#out = affine_map<(d0, d1) -> (d0, d1)>
module @embed {
  util.global private @table = #flow.parameter.named<"placement"::"embed.table"> : tensor<256x64xf32>

  func.func @embed(%ids: tensor<?xi64>) -> tensor<?x64xf32> {
    %table = util.global.load @table : tensor<256x64xf32>
    %c0 = arith.constant 0 : index
    %n = tensor.dim %ids, %c0 : tensor<?xi64>
    %init = tensor.empty(%n) : tensor<?x64xf32>
    %rows = linalg.generic {indexing_maps = [#ids, #out], iterator_types = ["parallel", "parallel"]}
        ins(%ids : tensor<?xi64>) outs(%init : tensor<?x64xf32>) {
      ^bb0(%id: i64, %o: f32):
        %row = arith.index_cast %id : i64 to index
        %col = linalg.index 1 : index
        %v = tensor.extract %table[%row, %col] : tensor<256x64xf32>
        linalg.yield %v : f32
    } -> tensor<?x64xf32>
    return %rows : tensor<?x64xf32>
  }
}
