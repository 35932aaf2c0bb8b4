// Issue 17's H200 cases on the kernel library, f16 with f32 accumulation, result f16 (as torch's
// cuBLAS calls return): matmul 8192^3 (A x B), and the GEMV 1x8192 by a 28672x8192 weight stored
// N x K (torch's Linear layout: x W^T) or K x N (x W).
func.func @matmul(%a: tensor<8192x8192xf16>, %b: tensor<8192x8192xf16>) -> tensor<8192x8192xf16> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8192x8192xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<8192x8192xf32>) -> tensor<8192x8192xf32>
  %r = linalg.matmul ins(%a, %b : tensor<8192x8192xf16>, tensor<8192x8192xf16>) outs(%f : tensor<8192x8192xf32>) -> tensor<8192x8192xf32>
  %e2 = tensor.empty() : tensor<8192x8192xf16>
  %t = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]} ins(%r : tensor<8192x8192xf32>) outs(%e2 : tensor<8192x8192xf16>) {
  ^bb0(%x: f32, %y: f16):
    %q = arith.truncf %x : f32 to f16
    linalg.yield %q : f16
  } -> tensor<8192x8192xf16>
  return %t : tensor<8192x8192xf16>
}

func.func @gemv_nk(%x: tensor<1x8192xf16>, %w: tensor<28672x8192xf16>) -> tensor<1x28672xf16> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x28672xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<1x28672xf32>) -> tensor<1x28672xf32>
  %r = linalg.matmul indexing_maps = [affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (n, k)>, affine_map<(m, n, k) -> (m, n)>] ins(%x, %w : tensor<1x8192xf16>, tensor<28672x8192xf16>) outs(%f : tensor<1x28672xf32>) -> tensor<1x28672xf32>
  %e2 = tensor.empty() : tensor<1x28672xf16>
  %t = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]} ins(%r : tensor<1x28672xf32>) outs(%e2 : tensor<1x28672xf16>) {
  ^bb0(%a: f32, %b: f16):
    %q = arith.truncf %a : f32 to f16
    linalg.yield %q : f16
  } -> tensor<1x28672xf16>
  return %t : tensor<1x28672xf16>
}

func.func @gemv_kn(%x: tensor<1x8192xf16>, %w: tensor<8192x28672xf16>) -> tensor<1x28672xf16> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x28672xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<1x28672xf32>) -> tensor<1x28672xf32>
  %r = linalg.matmul ins(%x, %w : tensor<1x8192xf16>, tensor<8192x28672xf16>) outs(%f : tensor<1x28672xf32>) -> tensor<1x28672xf32>
  %e2 = tensor.empty() : tensor<1x28672xf16>
  %t = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]} ins(%r : tensor<1x28672xf32>) outs(%e2 : tensor<1x28672xf16>) {
  ^bb0(%a: f32, %b: f16):
    %q = arith.truncf %a : f32 to f16
    linalg.yield %q : f16
  } -> tensor<1x28672xf16>
  return %t : tensor<1x28672xf16>
}
