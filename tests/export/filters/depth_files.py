"""A Depth Anything folder as transformers' save_pretrained writes it (config.json + model.safetensors), at the
published architecture (DINOv2 backbone, DPT neck and head) but narrow, with seeded weights scaled so the depth
varies over the image instead of vanishing under the random initialisation."""

from __future__ import annotations

from pathlib import Path


def tiny_depth_anything(folder: Path, seed: int = 0) -> Path:
    import torch
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation, Dinov2Config

    backbone = Dinov2Config(
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        mlp_ratio=2,
        image_size=518,
        patch_size=14,
        out_features=["stage1", "stage2", "stage3", "stage4"],
        reshape_hidden_states=False,
    )
    config = DepthAnythingConfig(
        backbone_config=backbone,
        reassemble_hidden_size=32,
        patch_size=14,
        neck_hidden_sizes=[8, 16, 32, 32],
        fusion_hidden_size=16,
        head_hidden_size=8,
    )
    torch.manual_seed(seed)
    model = DepthAnythingForDepthEstimation(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim > 1:
                param.copy_(torch.randn(param.shape, generator=generator) / param[0].numel() ** 0.5)
            elif name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    model.save_pretrained(folder)
    return folder
