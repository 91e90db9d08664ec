"""What Flux.1 and Chroma do differently from SD3 in the denoising loop, in numpy. Most of it is their families'
traits (enginefarm.families.traits), read where the loop needs them:

- `latent_packing` 2: the transformer sessions take unpacked latents, the exported graph packs them into 2x2
  patches and builds the position ids (export/flux.py); the token grid is latent height/2 x width/2.
- `sigma_spacing` "unit": sigmas evenly spaced from 1 down to 1/steps (not to the scheduler's sigma_min), shifted
  by `mu`, which grows with the token count, when the scheduler config asks (`use_dynamic_shifting`: dev and
  Chroma; schnell's config has a plain shift of 1): the flow-matching scheduler's `set_timesteps_for_image`.
- `guidance`: Flux dev is guidance-distilled ("embedded": the scale is a transformer input, one pass per step, no
  negative prompt); schnell takes neither ("none"); Chroma uses classifier-free guidance like SD3 ("cfg").

Here, Chroma's text mask: T5 alone, read with the tokenizer's attention mask; the transformer's text mask attends
every prompt token and the first padding token (its end of sequence), nothing after.
"""

from __future__ import annotations

import numpy as np


def text_mask(token_mask: np.ndarray) -> np.ndarray:
    """Chroma's transformer mask from the tokenizer's (1 on prompt tokens and the end of sequence): every position up
    to and including the first padding one, as float32 (what the exported transformer's `attention_mask` takes)."""
    lengths = np.asarray(token_mask).sum(axis=1, keepdims=True)
    return (np.arange(token_mask.shape[1])[None, :] <= lengths).astype(np.float32)
