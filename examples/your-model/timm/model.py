"""A timm model as timm returns it: resnet18 with random weights and 10 classes. For trained
weights, `timm.create_model("resnet18", pretrained=True)` downloads them from the Hugging Face
hub; `pretrained_cfg_overlay={"file": "path/to/model.safetensors"}` reads a local file."""

import timm
import torch


def build():
    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=10).eval()
    image = torch.randn(1, 3, 64, 64)  # timm's forward(x): a positional example
    return model, (image,)
