"""Export a small Hugging Face BERT classifier (from a config, seeded weights) to ONNX with
batch and sequence dynamic: the .onnx file a user would otherwise bring.

    .venv/bin/python examples/your-model/onnx/export.py examples/your-model/onnx/bert.onnx
"""

import sys

import torch
import transformers


def build():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=128, num_labels=3,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 8))
    # the three inputs a BERT tokenizer returns
    mask, segments = torch.ones_like(ids), torch.zeros_like(ids)
    return model, {"input_ids": ids, "attention_mask": mask, "token_type_ids": segments}


def main(path: str) -> None:
    model, inputs = build()
    axes = {0: "batch", 1: "seq"}
    torch.onnx.export(
        model,
        (),
        path,
        kwargs=inputs,
        input_names=list(inputs),
        output_names=["logits"],
        dynamic_axes={**dict.fromkeys(inputs, axes), "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,  # the TorchScript exporter; the default one needs `pip install onnxscript`
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1])
