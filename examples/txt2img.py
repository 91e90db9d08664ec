"""Text to image with Stable Diffusion 1.5, on enginefarm.load sessions only: text encoder -> UNet steps -> VAE decoder.

    python examples/txt2img.py "a lighthouse at dawn" [--model sd15] [--steps 20] [--guidance 7.5] [--latent 32]
                               [--seed 0] [--precision fp16] [--target openvino:cpu] [--out image.png]

The three components come from the store (ENGINEFARM_STORE or --store) through `enginefarm.load`, which picks,
fetches, verifies and loads each; nothing else runs a model. Build them first:
`enginefarm build recipes/sd15.toml` (or recipes/tiny_sd15.toml, model tiny-sd15: the same pipeline in miniature).

- Tokenizer: CLIP's BPE vocabulary is not part of this project, so words map to stable ids in CLIP's range
  (BOS 49406, each word's id from its hash, EOS 49407 padding to 77 tokens). The models here have random
  weights, for which any ids do; with trained SD 1.5 weights, pass real ids: --input-ids ids.npy (int64 [77],
  from transformers.CLIPTokenizer).
- Scheduler: DDIM (eta 0) on SD 1.5's scaled-linear schedule (beta 0.00085 to 0.012 over 1000 steps, steps
  offset by 1, the final step to alphas_cumprod[0]), written here in numpy.
- Classifier-free guidance: the empty prompt and the prompt run as one batch of 2 when the UNet's profile
  allows it, else as two runs.
- --latent N: the latent is N x N (SD 1.5: the image is 8N x 8N; tiny-sd15's decoder makes 2N x 2N).

It writes the image (PNG) and prints the time of each stage: loading each session, encoding the text, each
UNet step, decoding the latent.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import struct
import sys
import time
import zlib
from pathlib import Path

import numpy as np

TOKENS = 77
BOS, EOS = 49406, 49407
LATENT_SCALE = 0.18215  # SD 1.5's VAE scaling factor


def tokenize(prompt: str) -> np.ndarray:
    words = re.findall(r"[a-z0-9]+", prompt.lower())[: TOKENS - 2]
    ids = [BOS] + [int.from_bytes(hashlib.sha256(w.encode()).digest()[:4], "little") % BOS for w in words] + [EOS]
    return np.array(ids + [EOS] * (TOKENS - len(ids)), dtype=np.int64)


class Ddim:
    """DDIM sampling (eta 0) with SD 1.5's scheduler settings."""

    def __init__(self, steps: int, train_steps: int = 1000, beta_start: float = 0.00085, beta_end: float = 0.012) -> None:
        betas = np.linspace(beta_start ** 0.5, beta_end ** 0.5, train_steps, dtype=np.float64) ** 2
        self.alphas_cumprod = np.cumprod(1.0 - betas)
        self.stride = train_steps // steps
        self.timesteps = (np.arange(steps) * self.stride)[::-1] + 1  # "leading" spacing, steps_offset 1

    def step(self, eps: np.ndarray, t: int, x: np.ndarray) -> np.ndarray:
        a_t = self.alphas_cumprod[t]
        prev = t - self.stride
        a_prev = self.alphas_cumprod[prev] if prev >= 0 else self.alphas_cumprod[0]
        x0 = (x - np.sqrt(1 - a_t) * eps) / np.sqrt(a_t)
        return (np.sqrt(a_prev) * x0 + np.sqrt(1 - a_prev) * eps).astype(np.float32)


def write_png(path: Path, image: np.ndarray) -> None:
    """image: uint8 [height, width, 3]."""
    height, width, _ = image.shape
    raw = b"".join(b"\0" + image[row].tobytes() for row in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def generate(sessions, ids: np.ndarray, *, steps: int, guidance: float, latent: int, seed: int, batch2: bool,
             timed=lambda _label, fn: fn()) -> np.ndarray:
    """The diffusion loop on three sessions (`run(dict) -> dict`): returns the decoded image, float [1, 3, H, W]."""
    text, unet, vae = sessions["text_encoder"], sessions["unet"], sessions["vae_decoder"]
    both = np.stack([tokenize(""), ids])  # unconditional first, as diffusers does
    if batch2:
        states = timed("encode text", lambda: text.run({"input_ids": both})["last_hidden_state"])
    else:
        states = timed("encode text", lambda: np.concatenate([text.run({"input_ids": row[None]})["last_hidden_state"] for row in both]))
    scheduler = Ddim(steps)
    latents = np.random.default_rng(seed).standard_normal((1, 4, latent, latent)).astype(np.float32)
    for index, t in enumerate(scheduler.timesteps):
        def denoise(t=t):
            if batch2:
                out = unet.run({"sample": np.concatenate([latents, latents]), "timestep": np.full(2, t, np.float32),
                                "encoder_hidden_states": states})["out_sample"]
                return out[:1], out[1:]
            return tuple(unet.run({"sample": latents, "timestep": np.full(1, t, np.float32), "encoder_hidden_states": states[i:i + 1]})["out_sample"]
                         for i in (0, 1))
        uncond, cond = timed(f"unet step {index + 1}/{steps} (t={t})", denoise)
        latents = scheduler.step(uncond + guidance * (cond - uncond), int(t), latents)
    return timed("decode latent", lambda: vae.run({"latent": latents / LATENT_SCALE})["sample"])


def to_image(decoded: np.ndarray) -> np.ndarray:
    """VAE output in [-1, 1], [1, 3, H, W] -> uint8 [H, W, 3]."""
    return (np.clip(decoded[0].transpose(1, 2, 0) / 2 + 0.5, 0, 1) * 255).round().astype(np.uint8)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("prompt", nargs="?", default="a lighthouse on a cliff at dawn")
    p.add_argument("--model", default="sd15", help="the recipes' model name (sd15, tiny-sd15)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--guidance", type=float, default=7.5)
    p.add_argument("--latent", type=int, default=32, help="latent size N (N x N); must be inside the UNet's profile")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", choices=["fp32", "fp16"], help="default: whatever load() finds fastest")
    p.add_argument("--target", help="e.g. openvino:cpu (default: load() picks)")
    p.add_argument("--store", help="store to load from (default ENGINEFARM_STORE)")
    p.add_argument("--input-ids", type=Path, help="int64 [77] token ids from CLIP's tokenizer, instead of the stand-in")
    p.add_argument("--out", type=Path, default=Path("txt2img.png"))
    args = p.parse_args(argv)

    import enginefarm
    from enginefarm.errors import EnginefarmError

    timings: list[tuple[str, float]] = []

    def timed(label: str, fn):
        start = time.perf_counter()
        value = fn()
        timings.append((label, time.perf_counter() - start))
        print(f"{label:<28} {timings[-1][1] * 1000:9.0f} ms", flush=True)
        return value

    try:
        sessions = {name: timed(f"load {name}", lambda name=name: enginefarm.load(f"{args.model}/{name}", precision=args.precision,
                                                                                     store=args.store, target=args.target))
                    for name in ("text_encoder", "unet", "vae_decoder")}
    except EnginefarmError as exc:
        print(f"error: {exc}" + (f"\nhint: {exc.hint}" if exc.hint else ""), file=sys.stderr)
        return 1
    for name, session in sessions.items():
        art = session.artifact
        print(f"  {name:<14} {art.target} {art.precision} [{art.build_key[:12]}], runs in {session.compute_precision}")
    batch2 = all(sessions[name].artifact.profile[inp]["max"][0] >= 2 for name, inp in (("text_encoder", "input_ids"), ("unet", "sample")))
    ids = np.load(args.input_ids).astype(np.int64).reshape(TOKENS) if args.input_ids else tokenize(args.prompt)
    try:
        decoded = generate(sessions, ids, steps=args.steps, guidance=args.guidance, latent=args.latent, seed=args.seed, batch2=batch2, timed=timed)
    except EnginefarmError as exc:
        print(f"error: {exc}" + (f"\nhint: {exc.hint}" if exc.hint else ""), file=sys.stderr)
        return 1

    image = to_image(decoded)
    write_png(args.out, image)
    steps = [s for label, s in timings if label.startswith("unet step")]
    loads = sum(s for label, s in timings if label.startswith("load "))
    print(f"\nwrote {args.out} ({image.shape[1]}x{image.shape[0]})")
    print(f"load {loads:.2f} s | text {dict(timings)['encode text']:.2f} s | unet {sum(steps):.2f} s "
          f"({args.steps} steps, {np.mean(steps) * 1000:.0f} ms each) | decode {dict(timings)['decode latent']:.2f} s | "
          f"total {sum(s for _, s in timings):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
