"""Prompts to the UNet's text conditioning, per family: the family table says which encoders a prompt goes through,
which output of each is read (concatenated on the last axis), and which gives the pooled embedding."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .assets import ModelAssets
from .embeddings import AddedRows, Embedding, expand, refuse_known_words


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
        self.tokenizers = {
            name: ClipTokenizer.from_folder(assets.tokenizer_folder(name)) for name in self.family.text_encoders
        }
        self.zeros_for_empty = assets.force_zeros_for_empty_prompt
        configs = {name: assets.configs.get(name, {}) for name in self.family.text_encoders}
        # each encoder's token table, from its config: ids below it are its vocabulary
        self.widths = assets.text_widths
        self.added = {
            name: AddedRows(int(c.get("vocab_size") or len(self.tokenizers[name]))) for name, c in configs.items()
        }
        self.embeddings: list[Embedding] = []

    def add_embeddings(self, embeddings: list[Embedding]) -> None:
        """Textual-inversion words: into every tokenizer, their vectors to each encoder's added rows. Refused whole
        (nothing added) when a word is already known."""
        refuse_known_words(embeddings, self.tokenizers.values())
        for embedding in embeddings:
            for name, tokenizer in self.tokenizers.items():
                for token, vector in zip(tokenizer.add_tokens(embedding.words), embedding.vectors[name], strict=True):
                    self.added[name].vectors[token] = vector
        self.embeddings += embeddings

    def encode(self, prompts: list[str]) -> TextConditioning:
        from enginefarm.families import ADDED_EMBEDS

        hidden, pooled = [], None
        prompts = [expand(p, self.embeddings) for p in prompts]
        for name in self.family.text_encoders:
            session = self.sessions[name]
            feeds = self.added[name].feeds(
                self.tokenizers[name](prompts), self.widths[name], ADDED_EMBEDS in session.input_names, name
            )
            outputs = session.run(feeds)
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
            pooled = positive.pooled
            return TextConditioning(
                np.concatenate([np.zeros_like(positive.hidden), positive.hidden]),
                None if pooled is None else np.concatenate([np.zeros_like(pooled), pooled]),
            )
        return self.encode([negative_prompt or "", prompt])
