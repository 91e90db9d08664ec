"""The image sizes and batches a model's engines were built for, in a user's units: pixels and images, not the
latent tensor shapes of the denoiser's profile (`[2, 4, 64, 96]` outside `[1, 4, 32, 32] .. [2, 4, 64, 64]`)."""

from __future__ import annotations

from dataclasses import dataclass

from enginefarm.errors import ConfigError


@dataclass(frozen=True)
class PixelRange:
    """What a denoiser's profile covers: rows per call (2 per image under classifier-free guidance), and image
    height and width in pixels, each (min, max)."""

    batch: tuple[int, int]
    height: tuple[int, int]
    width: tuple[int, int]

    def __str__(self) -> str:
        def span(lo_hi: tuple[int, int]) -> str:
            return str(lo_hi[0]) if lo_hi[0] == lo_hi[1] else f"{lo_hi[0]}-{lo_hi[1]}"

        return f"{span(self.width)} x {span(self.height)} px, batch {span(self.batch)}"


def pixel_range(profile: dict, input_name: str, factor: int) -> PixelRange | None:
    """The range of a latent input [batch, channels, height, width] in a profile ({input: {"min", "max"}}), in image
    pixels at the VAE's `factor`; None when the profile does not range that input."""
    bounds = profile.get(input_name)
    if not bounds or len(bounds["min"]) != 4:
        return None
    lo, hi = bounds["min"], bounds["max"]
    return PixelRange((lo[0], hi[0]), (lo[2] * factor, hi[2] * factor), (lo[3] * factor, hi[3] * factor))


def check_image_size(session, input_name: str, height: int, width: int, factor: int, title: str) -> None:
    """Refuse an image size the loaded denoiser's engine was not built for, in pixels, before any work is done
    (nothing is checked when the session is not loaded or its profile does not range the latent)."""
    profile = getattr(getattr(session, "artifact", None), "profile", None) or {}
    covered = pixel_range(profile, input_name, factor)
    if covered is None:
        return
    (h_lo, h_hi), (w_lo, w_hi) = covered.height, covered.width
    if h_lo <= height <= h_hi and w_lo <= width <= w_hi:
        return
    raise ConfigError(
        f"{width}x{height} px is outside what this {title} model's engines were built for: {covered}",
        hint=f"choose a width in {w_lo}-{w_hi} and a height in {h_lo}-{h_hi} px, or export and build it again with a "
        "wider profile (`enginefarm export --latent MIN,OPT,MAX`: image pixels / 8)",
    )
