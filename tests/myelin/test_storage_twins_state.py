"""Storage twins skip functions that write module state: IREE 3.13 cannot compile such a twin
for CUDA (myelin.compiler.storage_twins), and a causal LM's prefill/decode store its KV cache."""

from __future__ import annotations

from iree.compiler import ir

from myelin.compiler.storage_twins import add_storage_twins

MODULE = """
util.global private mutable @state : tensor<4xf32>
util.func public @pure(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = arith.addf %x, %x : tensor<4xf32>
  util.return %y : tensor<4xf32>
}
util.func public @stateful(%x: tensor<4xf32>) -> tensor<4xf32> {
  util.global.store %x, @state : tensor<4xf32>
  %y = arith.addf %x, %x : tensor<4xf32>
  util.return %y : tensor<4xf32>
}
util.func private @store(%x: tensor<4xf32>) {
  util.global.store %x, @state : tensor<4xf32>
  util.return
}
util.func public @calls_a_store(%x: tensor<4xf32>) -> tensor<4xf32> {
  util.call @store(%x) : (tensor<4xf32>) -> ()
  %y = arith.addf %x, %x : tensor<4xf32>
  util.return %y : tensor<4xf32>
}
"""


def test_only_functions_without_state_writes_get_a_twin() -> None:
    with ir.Context() as context:
        context.allow_unregistered_dialects = True
        from iree.compiler.dialects import util  # noqa: F401  (registers the util dialect)

        module = ir.Module.parse(MODULE)
        assert add_storage_twins(module.operation) == ("pure",)
