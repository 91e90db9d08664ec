"""Prompts to the UNet's text conditioning, per family: the family table says which encoders a prompt goes through,
which output of each is read (concatenated on the last axis), and which gives the pooled embedding."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .assets import ModelAssets


@dataclass(frozen=True)
class TextConditioning:
    hidden: np.ndarray  # [batch, 77, cross_attention_dim]
    pooled: np.ndarray | None  # [batch, pooled_width] (SDXL's text_embeds), or None
    mask: np.ndarray | None = None  # [batch, text tokens] the transformer's text mask (Chroma), or None


class PromptEncoder:
    """The model's own tokenizers and its text-encoder sessions (`sessions`: component name → session)."""

    def __init__(self, assets: ModelAssets, sessions: dict) -> None:
        from .tokenizer import ClipTokenizer

        self.family = assets.family
        self.sessions = sessions
        self.tokenizers = {name: ClipTokenizer.from_folder(assets.tokenizer_folder(name)) for name in self.family.text_encoders}
        self.zeros_for_empty = assets.force_zeros_for_empty_prompt

    def encode(self, prompts: list[str]) -> TextConditioning:
        hidden, pooled = [], None
        for name in self.family.text_encoders:
            outputs = self.sessions[name].run({"input_ids": self.tokenizers[name](prompts)})
            hidden.append(outputs[self.family.prompt_output])
            if self.family.pooled_output and name == self.family.text_encoders[-1]:
                pooled = outputs[self.family.pooled_output]
        return TextConditioning(np.concatenate(hidden, axis=-1).astype(np.float32), pooled)

    def encode_pair(self, prompt: str, negative_prompt: str | None, guidance: bool) -> TextConditioning:
        """The conditioning of one image: [negative, positive] stacked when guidance is on (classifier-free
        guidance runs both as one batch), else the positive alone. A negative prompt of None is the empty prompt,
        or zeros where the model asks for them (SDXL's force_zeros_for_empty_prompt), as diffusers does."""
        if not guidance:
            return self.encode([prompt])
        if negative_prompt is None and self.zeros_for_empty:
            positive = self.encode([prompt])
            zeros = lambda a: None if a is None else np.concatenate([np.zeros_like(a), a])  # noqa: E731
            return TextConditioning(zeros(positive.hidden), zeros(positive.pooled))
        return self.encode([negative_prompt or "", prompt])
