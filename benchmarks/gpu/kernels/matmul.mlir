// The H200 kernel benchmark's graph: f16 matmuls with f32 accumulation (as torch's cuBLAS does),
// dynamic M, in both layouts; the same with a caller-provided output; and an identity for the
// DLPack round trip.
func.func @matmul(%a: tensor<?x8192xf16>, %b: tensor<8192x8192xf16>) -> tensor<?x8192xf16> {
  %c0 = arith.constant 0 : index
  %m = tensor.dim %a, %c0 : tensor<?x8192xf16>
  %e = tensor.empty(%m) : tensor<?x8192xf32>
  %z = arith.constant 0.0 : f32
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<?x8192xf32>) -> tensor<?x8192xf32>
  %r = linalg.matmul ins(%a, %b : tensor<?x8192xf16>, tensor<8192x8192xf16>) outs(%f : tensor<?x8192xf32>) -> tensor<?x8192xf32>
  %e2 = tensor.empty(%m) : tensor<?x8192xf16>
  %t = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]} ins(%r : tensor<?x8192xf32>) outs(%e2 : tensor<?x8192xf16>) {
  ^bb0(%x: f32, %y: f16):
    %q = arith.truncf %x : f32 to f16
    linalg.yield %q : f16
  } -> tensor<?x8192xf16>
  return %t : tensor<?x8192xf16>
}

func.func @matmul_bt(%a: tensor<?x8192xf16>, %b: tensor<8192x8192xf16>) -> tensor<?x8192xf16> {
  %c0 = arith.constant 0 : index
  %m = tensor.dim %a, %c0 : tensor<?x8192xf16>
  %e = tensor.empty(%m) : tensor<?x8192xf32>
  %z = arith.constant 0.0 : f32
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<?x8192xf32>) -> tensor<?x8192xf32>
  %r = linalg.matmul indexing_maps = [affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (n, k)>, affine_map<(m, n, k) -> (m, n)>] ins(%a, %b : tensor<?x8192xf16>, tensor<8192x8192xf16>) outs(%f : tensor<?x8192xf32>) -> tensor<?x8192xf32>
  %e2 = tensor.empty(%m) : tensor<?x8192xf16>
  %t = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]} ins(%r : tensor<?x8192xf32>) outs(%e2 : tensor<?x8192xf16>) {
  ^bb0(%x: f32, %y: f16):
    %q = arith.truncf %x : f32 to f16
    linalg.yield %q : f16
  } -> tensor<?x8192xf16>
  return %t : tensor<?x8192xf16>
}

func.func @matmul_into(%a: tensor<?x8192xf16>, %b: tensor<8192x8192xf16>, %out: tensor<?x8192xf16> {iree.abi.output = 0 : index}) -> tensor<?x8192xf16> {
  %t = call @matmul(%a, %b) : (tensor<?x8192xf16>, tensor<8192x8192xf16>) -> tensor<?x8192xf16>
  return %t : tensor<?x8192xf16>
}

func.func @identity(%x: tensor<?xf16>) -> tensor<?xf16> {
  return %x : tensor<?xf16>
}

// Llama-7B shapes: a decode projection (batch 8, one token each: static M, the skinny kernel)
// and the prefill FFN up-projection (2048 tokens, dynamic M), both x W^T as nn.Linear has them.
func.func @decode_bt(%x: tensor<8x4096xf16>, %w: tensor<4096x4096xf16>) -> tensor<8x4096xf16> {
  %e = tensor.empty() : tensor<8x4096xf32>
  %z = arith.constant 0.0 : f32
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<8x4096xf32>) -> tensor<8x4096xf32>
  %r = linalg.matmul indexing_maps = [affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (n, k)>, affine_map<(m, n, k) -> (m, n)>] ins(%x, %w : tensor<8x4096xf16>, tensor<4096x4096xf16>) outs(%f : tensor<8x4096xf32>) -> tensor<8x4096xf32>
  %e2 = tensor.empty() : tensor<8x4096xf16>
  %t = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]} ins(%r : tensor<8x4096xf32>) outs(%e2 : tensor<8x4096xf16>) {
  ^bb0(%a: f32, %b: f16):
    %q = arith.truncf %a : f32 to f16
    linalg.yield %q : f16
  } -> tensor<8x4096xf16>
  return %t : tensor<8x4096xf16>
}

func.func @ffn_up_bt(%x: tensor<?x4096xf16>, %w: tensor<11008x4096xf16>) -> tensor<?x11008xf16> {
  %c0 = arith.constant 0 : index
  %m = tensor.dim %x, %c0 : tensor<?x4096xf16>
  %e = tensor.empty(%m) : tensor<?x11008xf32>
  %z = arith.constant 0.0 : f32
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<?x11008xf32>) -> tensor<?x11008xf32>
  %r = linalg.matmul indexing_maps = [affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (n, k)>, affine_map<(m, n, k) -> (m, n)>] ins(%x, %w : tensor<?x4096xf16>, tensor<11008x4096xf16>) outs(%f : tensor<?x11008xf32>) -> tensor<?x11008xf32>
  %e2 = tensor.empty(%m) : tensor<?x11008xf16>
  %t = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]} ins(%r : tensor<?x11008xf32>) outs(%e2 : tensor<?x11008xf16>) {
  ^bb0(%a: f32, %b: f16):
    %q = arith.truncf %a : f32 to f16
    linalg.yield %q : f16
  } -> tensor<?x11008xf16>
  return %t : tensor<?x11008xf16>
}
