"""Library models as the libraries return them, from small configs with seeded weights (never
the hub): each function returns `(model, example inputs by argument name)`, the form a PLeX
torch graph's source function returns. The test builds them through `plex build` and calls the
same functions for the torch eager reference."""

from __future__ import annotations

import torch
import transformers

VOCAB = 100
TEXT = {"vocab_size": VOCAB, "num_hidden_layers": 2, "num_attention_heads": 2}
IMAGE = 32  # pixels per side: every vision model here takes a small image


def _text_inputs(seq: int = 8) -> dict[str, torch.Tensor]:
    # batch 1: the size users have; the frontend repeats it for the export
    ids = torch.randint(3, VOCAB, (1, seq), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _pixels(channels: int = 3) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(1, channels, IMAGE, IMAGE)}


def bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        **TEXT, hidden_size=32, intermediate_size=64, max_position_embeddings=64
    )
    return transformers.AutoModel.from_config(config).eval(), _text_inputs()


def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32, n_positions=128,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval(), _text_inputs()


def llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        **TEXT, hidden_size=32, intermediate_size=64, num_key_value_heads=1,
        max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval(), _text_inputs()


def t5_encoder():
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2
    )
    return transformers.T5EncoderModel(config).eval(), _text_inputs()


def whisper_encoder():
    torch.manual_seed(0)
    config = transformers.WhisperConfig(
        d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=64, num_mel_bins=16,
        max_source_positions=16,
    )  # fmt: skip
    encoder = transformers.WhisperModel(config).get_encoder().eval()
    # Whisper takes exactly 2 * max_source_positions frames: only the batch is dynamic
    return encoder, {"input_features": torch.randn(1, 16, 32)}


def clip_text():
    torch.manual_seed(0)
    config = transformers.CLIPTextConfig(
        **TEXT, hidden_size=32, intermediate_size=64, max_position_embeddings=32,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.CLIPTextModel(config).eval(), _text_inputs()


def vit():
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        image_size=IMAGE, patch_size=8, num_labels=10,
    )  # fmt: skip
    return transformers.ViTForImageClassification(config).eval(), _pixels()


def segformer():
    torch.manual_seed(0)
    config = transformers.SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
        patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
        decoder_hidden_size=32, num_labels=4,
    )  # fmt: skip
    return transformers.SegformerForSemanticSegmentation(config).eval(), _pixels()


def _timm(name: str, image: int = IMAGE, **kwargs):
    import timm  # needs torchvision, or the test's placeholder for it

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs).eval()
    return model, (torch.randn(1, 3, image, image),)


def timm_resnet50():
    # one block per stage: the same layer kinds. 64 pixels: at 32, the last stage's 3x3 conv
    # runs on a 1x1 map, which IREE 3.13 fails to compile with a dynamic batch
    return _timm("resnet50", image=64, layers=(1, 1, 1, 1))


def timm_vit_base():
    return _timm(
        "vit_base_patch16_224", img_size=IMAGE, patch_size=8, embed_dim=32, depth=2, num_heads=2
    )


def timm_deit_tiny():
    return _timm("deit_tiny_patch16_224", img_size=IMAGE, patch_size=8, depth=2)
