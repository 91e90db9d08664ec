"""Live previews: a step's predicted image, cheaply, without the VAE.

A latent space's channels are close to a linear function of the decoded image's colours, so a 3 × C matrix (and a
bias) turns a latent into a rough RGB picture at latent resolution. The factors are those ComfyUI publishes per latent
space in `comfy/latent_formats.py` (`latent_rgb_factors`, `latent_rgb_factors_bias`; read at commit 040a324 of
github.com/comfyanonymous/ComfyUI), fitted on the scaled (and shifted) latent the model denoises, which is the latent
our loop holds; the result is in about [-1, 1] like the VAE's output. A latent space is told by the family's VAE
scaling factor: SD 1.x and 2.x share one VAE (0.18215), SDXL and its refiner another (0.13025), SD3/SD3.5 (1.5305) and
Flux/Chroma (0.3611) their 16-channel ones.

A learned decoder (TAESD-class) plugs in through `Pipeline.preview_decoder`: any callable from the model-space latent
[N, C, h, w] to images [N, H, W, 3] in [0, 1]; the linear map is used where it is None."""

from __future__ import annotations

import numpy as np

from enginefarm.errors import ConfigError

# latent space (its VAE scaling factor) → (factors [C, 3]: rows are latent channels, columns R, G, B; bias [3])
LATENT_RGB: dict[float, tuple[tuple[tuple[float, float, float], ...], tuple[float, float, float]]] = {
    0.18215: (  # ComfyUI SD15
        ((0.3512, 0.2297, 0.3227), (0.3250, 0.4974, 0.2350), (-0.2829, 0.1762, 0.2721), (-0.2120, -0.2616, -0.7177)),
        (0.0, 0.0, 0.0),
    ),
    0.13025: (  # ComfyUI SDXL
        ((0.3651, 0.4232, 0.4341), (-0.2533, -0.0042, 0.1068), (0.1076, 0.1111, -0.0362), (-0.3165, -0.2492, -0.2188)),
        (0.1084, -0.0175, -0.0011),
    ),
    1.5305: (  # ComfyUI SD3
        (
            (-0.0922, -0.0175, 0.0749),
            (0.0311, 0.0633, 0.0954),
            (0.1994, 0.0927, 0.0458),
            (0.0856, 0.0339, 0.0902),
            (0.0587, 0.0272, -0.0496),
            (-0.0006, 0.1104, 0.0309),
            (0.0978, 0.0306, 0.0427),
            (-0.0042, 0.1038, 0.1358),
            (-0.0194, 0.0020, 0.0669),
            (-0.0488, 0.0130, -0.0268),
            (0.0922, 0.0988, 0.0951),
            (-0.0278, 0.0524, -0.0542),
            (0.0332, 0.0456, 0.0895),
            (-0.0069, -0.0030, -0.0810),
            (-0.0596, -0.0465, -0.0293),
            (-0.1448, -0.1463, -0.1189),
        ),
        (0.2394, 0.2135, 0.1925),
    ),
    0.3611: (  # ComfyUI Flux
        (
            (-0.0346, 0.0244, 0.0681),
            (0.0034, 0.0210, 0.0687),
            (0.0275, -0.0668, -0.0433),
            (-0.0174, 0.0160, 0.0617),
            (0.0859, 0.0721, 0.0329),
            (0.0004, 0.0383, 0.0115),
            (0.0405, 0.0861, 0.0915),
            (-0.0236, -0.0185, -0.0259),
            (-0.0245, 0.0250, 0.1180),
            (0.1008, 0.0755, -0.0421),
            (-0.0515, 0.0201, 0.0011),
            (0.0428, -0.0012, -0.0036),
            (0.0817, 0.0765, 0.0749),
            (-0.1264, -0.0522, -0.1103),
            (-0.0280, -0.0881, -0.0499),
            (-0.1262, -0.0982, -0.0778),
        ),
        (-0.0329, -0.0718, -0.0851),
    ),
}


def latent_rgb(scaling_factor: float, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """The (factors [C, 3], bias [3]) of a latent space, as float32."""
    for known, (factors, bias) in LATENT_RGB.items():
        if abs(known - scaling_factor) < 1e-6 and len(factors) == channels:
            return np.asarray(factors, np.float32), np.asarray(bias, np.float32)
    raise ConfigError(
        f"no preview map for a {channels}-channel latent space with VAE scaling factor {scaling_factor}",
        hint="leave on_preview out, or set pipe.preview_decoder to a decoder of this latent space",
    )


def linear_preview(latent: np.ndarray, factors: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Model-space latents [N, C, h, w] → float [N, h, w, 3] in [0, 1] (one pixel per latent pixel)."""
    rgb = np.einsum("nchw,ck->nhwk", latent.astype(np.float32), factors, optimize=True) + bias
    return np.clip(rgb * np.float32(0.5) + np.float32(0.5), 0.0, 1.0).astype(np.float32)
