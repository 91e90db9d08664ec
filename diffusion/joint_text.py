"""Prompts to a transformer family's text inputs (SD3, SD3.5; Flux and Chroma through the same table): each
encoder's tokenizer and session, assembled as the family's `JointText` says: hidden states side by side and
zero-padded to the transformer's text width, then appended on the token axis; pooled outputs side by side. An
encoder the model ships without (SD3 without T5) gives zeros of its shape, as diffusers does."""

from __future__ import annotations

import numpy as np

from enginefarm.errors import ConfigError, ModelError
from enginefarm.families import ADDED_EMBEDS

from .assets import ModelAssets
from .embeddings import AddedRows, expand, refuse_known_words
from .flux import text_mask
from .prompts import TextConditioning

HIDDEN, POOLED = 0, 1  # the parts of an encoder's outputs (_outputs)


class JointTextEncoder:
    def __init__(self, assets: ModelAssets, sessions: dict) -> None:
        from .tokenizer import ClipTokenizer, T5Tokenizer

        self.family, self.sizes, self.sessions = assets.family, assets.sizes, sessions
        self.present = [name for name in self.family.text_encoders if name in assets.components]
        self.tokenizers = {}
        for name in self.present:
            component = self.family.component(name)
            folder = assets.tokenizer_folder(name)
            self.tokenizers[name] = (
                T5Tokenizer.from_folder(folder, max_length=self.sizes.text_length(component))
                if component.tokenizer == "t5"
                else ClipTokenizer.from_folder(folder)
            )
        # the T5 token count a call reads when it does not choose one: the export's default (the profiles' opt)
        self.default_length = next(
            (self.sizes.text_length(c) for c in self.family.components if c.tokenizer == "t5"), None
        )

        # textual inversion: the CLIP encoders' added words (their rows past each token table); T5 reads them as text
        self.added = {
            name: AddedRows(int(assets.configs.get(name, {}).get("vocab_size") or len(self.tokenizers[name])))
            for name in self.present
            if self.family.component(name).tokenizer != "t5"
        }
        self.embeddings: list = []

    def add_embeddings(self, embeddings: list) -> None:
        """Textual-inversion words (read for this family's CLIP encoders by `read_embedding`) into those encoders'
        tokenizers, their vectors to the added rows. Refused whole (nothing added) when a word is already known."""
        refuse_known_words(embeddings, [self.tokenizers[n] for n in self.added])
        for embedding in embeddings:
            for name, vectors in embedding.vectors.items():
                if name in self.added:
                    for token, vector in zip(self.tokenizers[name].add_tokens(embedding.words), vectors, strict=True):
                        self.added[name].vectors[token] = vector
        self.embeddings += embeddings

    def length_bounds(self) -> tuple[int, int] | None:
        """(min, max) T5 token count the loaded sessions take: each T5's `input_ids` profile, and the transformer's
        text tokens less what the CLIP encoders put there; None when no loaded session says (nothing to check)."""
        bounds = []
        offset = self.sizes.context_for(self.family, 0)
        for name, input_name, axis_offset in [
            *((n, "input_ids", 0) for n in self.present if self.family.component(n).tokenizer == "t5"),
            ("transformer", "encoder_hidden_states", offset),
        ]:
            profile = getattr(getattr(self.sessions.get(name), "artifact", None), "profile", None) or {}
            if input_name in profile:
                bounds.append(
                    (profile[input_name]["min"][1] - axis_offset, profile[input_name]["max"][1] - axis_offset)
                )
        return (max(b[0] for b in bounds), min(b[1] for b in bounds)) if bounds else None

    def text_length(self, asked: int | None) -> int:
        """The T5 token count of a call: `asked` (diffusers' max_sequence_length) or the default, checked against
        what the sessions were built for before any of them runs."""
        length = self.default_length if asked is None else asked
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ConfigError(f"max_sequence_length={asked!r}", hint="a positive number of T5 tokens, e.g. 256 or 512")
        bounds = self.length_bounds()
        if bounds is not None and not bounds[0] <= length <= bounds[1]:
            raise ConfigError(
                f"max_sequence_length={length} is outside what {self.family.title}'s engines were built for "
                f"({bounds[0]}..{bounds[1]} T5 tokens)",
                hint=f"use {bounds[0]}..{bounds[1]}, or export with --text-length MIN,OPT,MAX and rebuild",
            )
        return length

    def _outputs(self, name: str, prompts: list[str], length: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(hidden states, pooled) of one encoder: its 3-dim output and its 2-dim one, by the family table. `length`:
        the T5 token count (CLIP reads its 77)."""
        component = self.family.component(name)
        tokens = length if component.tokenizer == "t5" else self.sizes.text_length(component)
        if name not in self.present:
            hidden: np.ndarray | None = np.zeros(
                (len(prompts), tokens, self.sizes.text_widths[component.text_index]), np.float32
            )
            pooled = (
                np.zeros((len(prompts), self.sizes.projection_widths[component.text_index]), np.float32)
                if self.sizes.projection_widths
                else None
            )
            return hidden, pooled
        inputs = {t.name for t in component.inputs}
        if (
            name in self.added
        ):  # a multi-vector word becomes its n words where this tokenizer knows them (diffusers' maybe_convert_prompt)
            prompts = [expand(p, [e for e in self.embeddings if name in e.vectors]) for p in prompts]
        ids = (
            self.tokenizers[name](prompts, max_length=tokens)
            if component.tokenizer == "t5"
            else self.tokenizers[name](prompts)
        )
        feeds = {"input_ids": ids}
        if ADDED_EMBEDS in inputs and name in self.added:  # the CLIP encoders' rows for added words
            feeds = self.added[name].feeds(ids, self.sizes.value("text_width", component), True, name)
        if "attention_mask" in inputs:  # Chroma's T5 reads the tokenizer's mask
            feeds["attention_mask"] = self.token_masks[name] = (ids != self.tokenizers[name].pad_id).astype(np.int64)
        outputs = self.sessions[name].run(feeds)
        hidden = next(
            (outputs[t.name] for t in component.outputs if len(t.shape) == 3), None
        )  # Flux's CLIP gives only its pooled state
        pooled = next((outputs[t.name] for t in component.outputs if len(t.shape) == 2), None)
        return hidden, pooled

    def encode(self, prompts: list[str], max_sequence_length: int | None = None) -> TextConditioning:
        joint = self.family.joint_text
        assert joint is not None, f"{self.family.id} has a transformer, so it declares its joint text"
        length = self.text_length(max_sequence_length)
        self.token_masks: dict[str, np.ndarray] = {}
        outputs = {name: self._outputs(name, prompts, length) for name in self.family.text_encoders}
        parts = []
        if joint.width:
            side_by_side = np.concatenate([self._joined(outputs, n, HIDDEN) for n in joint.width], axis=-1)
            pad = self.sizes.cross_attention_dim - side_by_side.shape[-1]
            parts.append(np.pad(side_by_side, ((0, 0), (0, 0), (0, pad))))
        parts += [self._joined(outputs, n, HIDDEN) for n in joint.tokens]
        pooled = (
            np.concatenate([self._joined(outputs, n, POOLED) for n in joint.pooled], axis=-1).astype(np.float32)
            if joint.pooled
            else None
        )
        # Chroma: the transformer attends the prompt's tokens and the first padding one (flux.text_mask)
        mask = text_mask(next(iter(self.token_masks.values()))) if self.token_masks else None
        return TextConditioning(np.concatenate(parts, axis=1).astype(np.float32), pooled, mask)

    def _joined(
        self, outputs: dict[str, tuple[np.ndarray | None, np.ndarray | None]], name: str, part: int
    ) -> np.ndarray:
        """The hidden states (HIDDEN) or pooled output (POOLED) of encoder `name` that the family's joint text
        reads; an artifact without that output is refused in one line, not at a concatenate."""
        value = outputs[name][part]
        if value is None:
            what = "hidden states (a 3-dim output)" if part == HIDDEN else "pooled output (a 2-dim output)"
            raise ModelError(
                f"{self.family.id}'s {name} gives no {what}, which the family's joint text reads",
                hint="export and build the text encoder with this enginefarm's family table",
            )
        return value

    def encode_pair(
        self, prompt: str, negative_prompt: str | None, guidance: bool, max_sequence_length: int | None = None
    ) -> TextConditioning:
        """[negative, positive] under classifier-free guidance (a None negative is the empty prompt, encoded), else
        the positive alone; T5 reads `max_sequence_length` tokens (default: the export's)."""
        return self.encode([negative_prompt or "", prompt] if guidance else [prompt], max_sequence_length)
