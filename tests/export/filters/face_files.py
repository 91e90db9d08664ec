"""Face networks at their published key layouts with seeded random weights, narrowed so tests stay fast: GFPGAN
v1.4's GFPGANv1Clean (spandrel's class, the reference) and facexlib's RetinaFace. Saved as users' files are."""

from __future__ import annotations

from pathlib import Path


def _randomise(module, seed: int) -> None:
    """Every parameter and buffer drawn from a seeded normal, scaled to keep activations in range; the zero-initialised
    ones (noise strengths, biases) too, so every path is exercised."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
            if not tensor.is_floating_point():
                continue
            fan_in = tensor[0].numel() if tensor.ndim > 1 else 1
            scale = 1.0 / fan_in**0.5 if tensor.ndim > 1 else 0.1
            if "running_var" in name:
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=generator))
            else:
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * scale)


def tiny_gfpgan(narrow: float = 1 / 16, style_size: int = 64, seed: int = 0):
    """spandrel's GFPGANv1Clean at GFPGANv1.4's settings (512², channel multiplier 2, different_w, sft_half), its
    widths × narrow, eval mode, seeded random weights."""
    import torch
    from spandrel.architectures.GFPGAN import GFPGAN

    model = GFPGAN(
        out_size=512,
        num_style_feat=style_size,
        channel_multiplier=2,
        narrow=narrow,
        different_w=True,
        sft_half=True,
        input_is_latent=True,
    )
    _randomise(model, seed)
    with torch.no_grad():  # the RGB heads scaled down so faces come out mostly inside [-1, 1], as trained ones do
        for name, tensor in model.stylegan_decoder.named_parameters():
            if name.startswith(("to_rgb1.", "to_rgbs.")):
                tensor.mul_(0.15)
    return model.eval()


def save_gfpgan(model, path: Path) -> Path:
    """As GFPGANv1.4.pth is: {"params_ema": state dict}."""
    import torch

    torch.save({"params_ema": model.state_dict()}, path)
    return path


def facexlib_retinaface(body: str = "mobile0.25", seed: int = 0):
    """facexlib's own RetinaFace ("mobile0.25" at its real width, or "resnet50"), seeded random weights, eval mode.
    facexlib's package __init__ pulls its tracking code (numba, filterpy); only its detection modules are loaded."""
    import importlib.util
    import sys
    import types

    import pytest
    import torch

    if "facexlib" not in sys.modules:
        spec = importlib.util.find_spec("facexlib")
        if spec is None or spec.submodule_search_locations is None:
            pytest.skip("facexlib is not installed (the reference for the face detector)")
        package = types.ModuleType("facexlib")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["facexlib"] = package
    from facexlib.detection.retinaface import RetinaFace

    model = RetinaFace(network_name=body, device="cpu")
    _randomise(model, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # BatchNorm scales near 1, so the image still shows after 30 layers
        for layer in model.modules():
            if isinstance(layer, torch.nn.BatchNorm2d):
                layer.weight.copy_(1 + 0.2 * torch.randn(layer.weight.shape, generator=generator))
    return model.eval()


def save_retinaface(model, path: Path) -> Path:
    """As facexlib's detection_*_Final.pth are: the bare state dict, every key under DataParallel's `module.`."""
    import torch

    torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, path)
    return path


def tiny_codeformer(seed: int = 0):
    """spandrel_extra_arches' CodeFormer (the reference) at the published block layout, narrowed: its VQGAN at 32
    channels on every level (the published one is 64·[1, 2, 2, 4, 4, 8]), a 2-layer transformer of width 64 and a
    64-entry codebook. The class fixes the VQGAN's widths, so a subclass passes narrow ones to it and rebuilds the
    fuse blocks at that width; every forward is the reference's own."""
    import pytest
    import torch

    arch = pytest.importorskip("spandrel_extra_arches.architectures.CodeFormer.__arch.codeformer")

    class NarrowVQGAN(arch.VQAutoEncoder):
        def __init__(self, img_size, nf, ch_mult, quantizer, res_blocks, attn_resolutions, codebook_size):
            super().__init__(img_size, 32, [1] * 6, quantizer, res_blocks, attn_resolutions, codebook_size)

    class NarrowCodeFormer(arch.CodeFormer, NarrowVQGAN):
        def __init__(self):
            super().__init__(dim_embd=64, n_head=8, n_layers=2, codebook_size=64)
            self.fuse_convs_dict = torch.nn.ModuleDict({s: arch.Fuse_sft_block(32, 32) for s in self.connect_list})

    torch.manual_seed(seed)
    model = NarrowCodeFormer()
    _randomise(model, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # norms' scales near 1 (a random scale would wash the face out over 40 blocks)
        for layer in model.modules():
            if isinstance(layer, torch.nn.GroupNorm | torch.nn.LayerNorm):
                layer.weight.copy_(1 + 0.2 * torch.randn(layer.weight.shape, generator=generator))
    return model.eval()


def save_codeformer(model, path: Path) -> Path:
    """As codeformer.pth is: {"params_ema": state dict}."""
    import torch

    torch.save({"params_ema": model.state_dict()}, path)
    return path
