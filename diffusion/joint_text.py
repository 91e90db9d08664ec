"""Prompts to a transformer family's text inputs (SD3, SD3.5; Flux and Chroma through the same table): each
encoder's tokenizer and session, assembled as the family's `JointText` says: hidden states side by side and
zero-padded to the transformer's text width, then appended on the token axis; pooled outputs side by side. An
encoder the model ships without (SD3 without T5) gives zeros of its shape, as diffusers does."""

from __future__ import annotations

import numpy as np

from enginefarm.errors import ConfigError
from enginefarm.families import ADDED_EMBEDS

from .assets import ModelAssets
from .embeddings import AddedRows, expand
from .flux import text_mask
from .prompts import TextConditioning


class JointTextEncoder:
    def __init__(self, assets: ModelAssets, sessions: dict) -> None:
        from .tokenizer import ClipTokenizer, T5Tokenizer

        self.family, self.sizes, self.sessions = assets.family, assets.sizes, sessions
        self.present = [name for name in self.family.text_encoders if name in assets.components]
        self.tokenizers = {}
        for name in self.present:
            component = self.family.component(name)
            folder = assets.tokenizer_folder(name)
            length = self.sizes.value("text_length", component)
            self.tokenizers[name] = (T5Tokenizer.from_folder(folder, max_length=length) if component.tokenizer == "t5"
                                     else ClipTokenizer.from_folder(folder))

        # textual inversion: the CLIP encoders' added words (their rows past each token table); T5 reads them as text
        self.added = {name: AddedRows(int(assets.configs.get(name, {}).get("vocab_size") or len(self.tokenizers[name])))
                      for name in self.present if self.family.component(name).tokenizer != "t5"}
        self.embeddings: list = []

    def add_embeddings(self, embeddings: list) -> None:
        """Textual-inversion words (read for this family's CLIP encoders by `read_embedding`) into those encoders'
        tokenizers, their vectors to the added rows. Refused whole (nothing added) when a word is already known."""
        words = [w for e in embeddings for w in e.words]
        known = [w for w in words if any(self.tokenizers[n].token_to_id(w) is not None for n in self.added)]
        if known or len(set(words)) < len(words):
            clash = known or sorted({w for w in words if words.count(w) > 1})
            raise ConfigError(f"textual-inversion word(s) {clash[:3]} already in the tokenizer or given twice",
                              hint='choose another word: embeddings=[("file.safetensors", "<my-word>")]')
        for embedding in embeddings:
            for name, vectors in embedding.vectors.items():
                if name in self.added:
                    for token, vector in zip(self.tokenizers[name].add_tokens(embedding.words), vectors):
                        self.added[name].vectors[token] = vector
        self.embeddings += embeddings

    def _outputs(self, name: str, prompts: list[str]) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(hidden states, pooled) of one encoder: its 3-dim output and its 2-dim one, by the family table."""
        component = self.family.component(name)
        if name not in self.present:
            hidden = np.zeros((len(prompts), self.sizes.value("text_length", component), self.sizes.text_widths[component.text_index]), np.float32)
            pooled = np.zeros((len(prompts), self.sizes.projection_widths[component.text_index]), np.float32) if self.sizes.projection_widths else None
            return hidden, pooled
        inputs = {t.name for t in component.inputs}
        if name in self.added:  # a multi-vector word becomes its n words where this tokenizer knows them (diffusers' maybe_convert_prompt)
            prompts = [expand(p, [e for e in self.embeddings if name in e.vectors]) for p in prompts]
        ids = self.tokenizers[name](prompts)
        feeds = {"input_ids": ids}
        if ADDED_EMBEDS in inputs and name in self.added:  # the CLIP encoders' rows for added words
            feeds = self.added[name].feeds(ids, self.sizes.value("text_width", component), True, name)
        if "attention_mask" in inputs:  # Chroma's T5 reads the tokenizer's mask
            feeds["attention_mask"] = self.token_masks[name] = (ids != self.tokenizers[name].pad_id).astype(np.int64)
        outputs = self.sessions[name].run(feeds)
        hidden = next((outputs[t.name] for t in component.outputs if len(t.shape) == 3), None)  # Flux's CLIP gives only its pooled state
        pooled = next((outputs[t.name] for t in component.outputs if len(t.shape) == 2), None)
        return hidden, pooled

    def encode(self, prompts: list[str]) -> TextConditioning:
        joint = self.family.joint_text
        self.token_masks: dict[str, np.ndarray] = {}
        outputs = {name: self._outputs(name, prompts) for name in self.family.text_encoders}
        parts = []
        if joint.width:
            side_by_side = np.concatenate([outputs[n][0] for n in joint.width], axis=-1)
            pad = self.sizes.cross_attention_dim - side_by_side.shape[-1]
            parts.append(np.pad(side_by_side, ((0, 0), (0, 0), (0, pad))))
        parts += [outputs[n][0] for n in joint.tokens]
        pooled = np.concatenate([outputs[n][1] for n in joint.pooled], axis=-1).astype(np.float32) if joint.pooled else None
        # Chroma: the transformer attends the prompt's tokens and the first padding one (flux.text_mask)
        mask = text_mask(next(iter(self.token_masks.values()))) if self.token_masks else None
        return TextConditioning(np.concatenate(parts, axis=1).astype(np.float32), pooled, mask)

    def encode_pair(self, prompt: str, negative_prompt: str | None, guidance: bool) -> TextConditioning:
        """[negative, positive] under classifier-free guidance (a None negative is the empty prompt, encoded), else
        the positive alone."""
        return self.encode([negative_prompt or "", prompt] if guidance else [prompt])
