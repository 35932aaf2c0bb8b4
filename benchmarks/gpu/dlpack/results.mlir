// Device results that export DLPack (docs/runtime.md, "GPU tensors in and out"): identity-like
// entrypoints whose result IREE computes into new memory (one elementwise pass, the traffic of a
// copy). `negate` has a static 256 MiB float16 shape (result storage sized from the signature);
// `negate_dyn` a dynamic one (result shapes learned by the first call of each input shape).
func.func @negate(%x: tensor<134217728xf16>) -> tensor<134217728xf16> {
  %y = arith.negf %x : tensor<134217728xf16>
  return %y : tensor<134217728xf16>
}

func.func @negate_dyn(%x: tensor<?xf16>) -> tensor<?xf16> {
  %y = arith.negf %x : tensor<?xf16>
  return %y : tensor<?xf16>
}

// A result that is an argument: it aliases the (imported) input and exports as it is.
func.func @identity(%x: tensor<?xf16>) -> tensor<?xf16> {
  return %x : tensor<?xf16>
}
