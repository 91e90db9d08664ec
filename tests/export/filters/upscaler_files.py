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
