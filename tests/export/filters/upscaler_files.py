"""Upscaler files as users have them, with seeded random weights: Real-ESRGAN's basicsr layout nested under
"params_ema" (RealESRGAN_x4plus.pth, x2plus, anime_6B), the old ESRGAN layout (4x-UltraSharp.pth: `model.N…`), and
SRVGGNetCompact (realesr-animevideov3.pth, nested under "params"). Weights are scaled so the outputs stay mostly
inside [0, 1], where the runtime's clamp keeps them, and the comparisons see real values."""

from __future__ import annotations

from pathlib import Path


def _conv(generator, state: dict, name: str, cin: int, cout: int, gain: float = 0.5) -> None:
    import torch

    state[f"{name}.weight"] = torch.randn(cout, cin, 3, 3, generator=generator) * (gain / (cin * 9) ** 0.5)
    state[f"{name}.bias"] = torch.randn(cout, generator=generator) * 0.02


def rrdb_state(features=16, blocks=2, growth=32, unshuffle=1, seed=0) -> dict:
    """basicsr's RRDBNet keys (conv_first, body.N.rdbK.convJ, conv_body, conv_up1/2, conv_hr, conv_last): ×4, or ×2
    with `unshuffle=2` (RealESRGAN_x2plus), ×1 with 4."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    state: dict = {}
    _conv(generator, state, "conv_first", 3 * unshuffle * unshuffle, features)
    for i in range(blocks):
        for k in (1, 2, 3):
            for j in range(1, 6):
                cin = features + (j - 1) * growth
                _conv(generator, state, f"body.{i}.rdb{k}.conv{j}", cin, features if j == 5 else growth)
    _conv(generator, state, "conv_body", features, features)
    _conv(generator, state, "conv_up1", features, features, 1.0)
    _conv(generator, state, "conv_up2", features, features, 1.0)
    _conv(generator, state, "conv_hr", features, features, 1.0)
    _conv(generator, state, "conv_last", features, 3, 3.0)
    state["conv_last.bias"] = state["conv_last.bias"] + 0.5  # outputs around mid-grey
    return state


def old_esrgan_state(features=16, blocks=2, growth=32, seed=0) -> dict:
    """The same ×4 network in the old ESRGAN layout (4x-UltraSharp.pth): model.0, model.1.sub.N.RDBk.convj.0,
    model.1.sub.NB, model.3 and model.6 (the ×2 steps), model.8 (HR conv), model.10 (last)."""
    new = rrdb_state(features, blocks, growth, 1, seed)
    names = {"conv_first": "model.0", "conv_body": f"model.1.sub.{blocks}", "conv_up1": "model.3"}
    names.update({"conv_up2": "model.6", "conv_hr": "model.8", "conv_last": "model.10"})
    state = {}
    for key, value in new.items():
        layer, kind = key.rsplit(".", 1)
        if layer.startswith("body."):
            _, i, rdb, conv = layer.split(".")
            state[f"model.1.sub.{i}.RDB{rdb[3:]}.{conv}.0.{kind}"] = value
        else:
            state[f"{names[layer]}.{kind}"] = value
    return state


def srvgg_state(features=16, convs=4, scale=4, seed=0) -> dict:
    """SRVGGNetCompact's `body.N` chain: conv, PReLU, `convs` × (conv, PReLU), conv to 3·scale² channels."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    state: dict = {}
    index = 0
    for cin in [3] + [features] * convs:
        _conv(generator, state, f"body.{index}", cin, features, 1.0)
        state[f"body.{index + 1}.weight"] = torch.full((features,), 0.2) + 0.05 * torch.randn(
            features, generator=generator
        )
        index += 2
    _conv(generator, state, f"body.{index}", features, 3 * scale * scale, 0.3)
    return state


def save(state: dict, path: Path, nesting: str | None = "params_ema") -> Path:
    """`state` written as users' files hold it: a .pth (torch.save, nested under `nesting`) or .safetensors."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save({nesting: state} if nesting else state, str(path))
    return path


def spandrel_model(path: Path):
    """spandrel's own torch model for the file: the reference."""
    from spandrel import ModelLoader

    return ModelLoader(device="cpu").load_from_file(str(path)).model.eval()


def esrgan_plus_state(features=16, blocks=2, growth=32, scale=4, seed=0) -> dict:
    """ESRGAN+ (ncarraz/ESRGANplus) in the old layout: each dense block adds a bias-free 1x1 conv
    `model.1.sub.N.RDBk.conv1x1` from its input to its second conv's output. `scale=3`: the old layout's single ×3
    step (model.3), whose keys are those of a ×2 file."""
    import torch

    generator = torch.Generator().manual_seed(seed + 100)
    state = old_esrgan_state(features, blocks, growth, seed)
    if scale == 3:  # one upsample step: model.3, then HR conv model.5 and last conv model.7
        for kind in ("weight", "bias"):
            state.pop(f"model.3.{kind}")
            state[f"model.3.{kind}"] = state.pop(f"model.6.{kind}")
            state[f"model.5.{kind}"] = state.pop(f"model.8.{kind}")
            state[f"model.7.{kind}"] = state.pop(f"model.10.{kind}")
    for i in range(blocks):
        for k in (1, 2, 3):
            weight = torch.randn(growth, features, 1, 1, generator=generator) * (0.5 / features**0.5)
            state[f"model.1.sub.{i}.RDB{k}.conv1x1.weight"] = weight
    return state


LAST_CONV_GAIN = 0.15


def _seeded(model, seed: int) -> dict:
    """`model`'s state with every weight drawn again from `seed`, larger than the nets' training-start init (so
    the attention is far from uniform and the outputs vary), keeping the index tables and masks as built."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    state = model.state_dict()
    for name, value in state.items():
        if not value.is_floating_point() or name.endswith(("attn_mask", "attn_mask_0", "attn_mask_1", "rpe_biases")):
            continue
        if name.endswith(("running_mean", "running_var", "num_batches_tracked")):
            continue
        if value.ndim == 1 and name.endswith(".weight"):  # the layer and batch norms' scales
            state[name] = 1.0 + 0.1 * torch.randn(value.shape, generator=generator)
        elif value.ndim == 1:
            state[name] = 0.02 * torch.randn(value.shape, generator=generator)
        else:
            fan_in = value[0].numel() if value.ndim > 1 else 1
            # the last conv quieter, so the outputs stay mostly inside [0, 1] around the nets' mean colour
            gain = LAST_CONV_GAIN if name.startswith(("conv_last.", "upsample.0.")) else 1.0
            state[name] = torch.randn(value.shape, generator=generator) * (gain / fan_in**0.5)
    return state


def swinir_state(
    embed_dim=12, depths=(2, 2), heads=(2, 2), window=8, scale=4, upsampler="nearest+conv", in_chans=3, seed=0
):
    """SwinIR's keys (layers.N.residual_group.blocks.M…, conv_first, conv_after_body, the upsampler's), as the
    official files hold them (their attention masks for 64-pixel training patches included), at a narrow width."""
    import torch
    from spandrel.architectures.SwinIR import SwinIR

    torch.manual_seed(seed)
    model = SwinIR(
        img_size=64,
        in_chans=in_chans,
        embed_dim=embed_dim,
        depths=list(depths),
        num_heads=list(heads),
        window_size=window,
        mlp_ratio=2.0,
        upscale=scale,
        img_range=1.0,
        upsampler=upsampler,
        resi_connection="1conv",
    )
    return _seeded(model, seed)


def hat_state(embed_dim=12, depths=(2, 2), heads=(2, 2), window=16, scale=4, seed=0):
    """HAT's keys (relative_position_index_SA/OCA, layers.N.residual_group.blocks.M.conv_block.cab…,
    overlap_attn…, the pixel-shuffle upsampler) as Real_HAT_GAN_SRx4.pth holds them, at a narrow width."""
    import torch
    from spandrel.architectures.HAT import HAT

    torch.manual_seed(seed)
    model = HAT(
        img_size=64,
        embed_dim=embed_dim,
        depths=list(depths),
        num_heads=list(heads),
        window_size=window,
        compress_ratio=3,
        squeeze_factor=4,
        mlp_ratio=2.0,
        upscale=scale,
        num_feat=16,
    )
    return _seeded(model, seed)


def dat_state(embed_dim=32, depth=(2, 2), heads=(2, 2), split=(8, 16), scale=4, seed=0):
    """DAT's keys (before_RG, layers.N.blocks.M.attn.attns.K…, ffn.sg…, norm, the pixel-shuffle upsampler) as
    4xNomos8kDAT.pth holds them, at a narrow width (32: its position-bias MLPs are embed_dim // 32 wide per pair of
    heads)."""
    import torch
    from spandrel.architectures.DAT import DAT

    torch.manual_seed(seed)
    model = DAT(
        img_size=64,
        embed_dim=embed_dim,
        split_size=list(split),
        depth=list(depth),
        num_heads=list(heads),
        expansion_factor=2.0,
        upscale=scale,
    )
    return _seeded(model, seed)
