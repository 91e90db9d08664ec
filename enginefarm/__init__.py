"""enginefarm: ahead-of-time engines for Stable Diffusion-class models, fetched and verified on the device.

    import enginefarm
    session = enginefarm.load("sd15/vae_decoder", precision="fp16")
    outputs = session.run({"latent": latent})

Importing this package loads no vendor SDK, no onnx and no boto3: they load when first needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import EnginefarmError

if TYPE_CHECKING:
    from enginefarm.runner.session import Session

__version__ = "0.1.0"


def load(ref: str, precision: str | None = None, device: str = "auto", store: str | None = None, weights=None, loras=(), **kwargs) -> "Session":
    """The best artifact of `ref` ("model/component") for this device, verified and loaded.

    precision: "fp32", "fp16", "bf16" or None (the fastest measured). device: "auto", "cpu", "nvidia", "intel"...
    store: a store URL (default ENGINEFARM_STORE). recipe=PATH lets it compile here when nothing stored fits.
    channel="stable", trusted_root=PATH (the channel's root.json, shipped with the app): load only what the
    maintainers released and signed in that channel (default ENGINEFARM_CHANNEL, ENGINEFARM_TRUSTED_ROOT).
    weights: a custom checkpoint (.safetensors): the base checkpoint's names, or a whole-model file as model sites
    ship it (SD 1.x/2.x original layout, SDXL SGM layout, a VAE), of which the component takes its part;
    loras: [(path, strength), ...].
    progress=callable(str) receives progress messages.
    """
    from enginefarm.runner.load import load as _load

    return _load(ref, precision, device, store, weights, loras, **kwargs)


__all__ = ["EnginefarmError", "__version__", "load"]
