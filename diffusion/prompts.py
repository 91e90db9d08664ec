"""Prompts to the UNet's text conditioning, per family: the family table says which encoders a prompt goes through,
which output of each is read (concatenated on the last axis), and which gives the pooled embedding. Prompts are
parsed for weights (prompt_weights.py) and cut into chunks of 77 tokens, weighted as A1111 or compel does
(weighted_text.py); clip_skip reads the encoders' every-layer output."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from enginefarm.errors import ConfigError
from enginefarm.families import TOKENS

from .assets import ModelAssets
from .embeddings import AddedRows, Embedding, expand, refuse_known_words

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TextConditioning:
    hidden: np.ndarray  # [batch, 77 × chunks, cross_attention_dim]: a long prompt is several chunks of 77
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
        self.layers = {name: int(c.get("num_hidden_layers") or 0) for name, c in configs.items()}

    def add_embeddings(self, embeddings: list[Embedding]) -> None:
        """Textual-inversion words: into every tokenizer, their vectors to each encoder's added rows. Refused whole
        (nothing added) when a word is already known."""
        refuse_known_words(embeddings, self.tokenizers.values())
        for embedding in embeddings:
            for name, tokenizer in self.tokenizers.items():
                for token, vector in zip(tokenizer.add_tokens(embedding.words), embedding.vectors[name], strict=True):
                    self.added[name].vectors[token] = vector
        self.embeddings += embeddings

    def encode(self, prompts: list[str], syntax: str = "none", clip_skip: int | None = None) -> TextConditioning:
        """Each prompt's conditioning, stacked; prompts whose chunk counts differ are padded with the empty
        prompt's chunk, as A1111 and compel pad a negative prompt to the positive's length."""
        encoded = [self._encode_one(p, syntax, clip_skip) for p in prompts]
        chunks = max(e.hidden.shape[1] for e in encoded) // self._length
        if any(e.hidden.shape[1] != chunks * self._length for e in encoded):
            empty = self._encode_one("", "none", clip_skip).hidden
            encoded = [_padded(e, empty, chunks) for e in encoded]
        pooled = [e.pooled for e in encoded]
        return TextConditioning(
            np.concatenate([e.hidden for e in encoded]),
            None if pooled[0] is None else np.concatenate(pooled),  # type: ignore[arg-type]
        )

    def encode_pair(
        self,
        prompt: str,
        negative_prompt: str | None,
        guidance: bool,
        syntax: str = "a1111",
        clip_skip: int | None = None,
    ) -> TextConditioning:
        """The conditioning of one image: [negative, positive] stacked when guidance is on (classifier-free
        guidance runs both as one batch), else the positive alone. A negative prompt of None is the empty prompt,
        or zeros where the model asks for them (SDXL's force_zeros_for_empty_prompt), as diffusers does. `syntax`:
        the prompts' weighting syntax (prompt_weights.SYNTAXES); `clip_skip`: diffusers' meaning (1: the layer before
        the one the pipeline reads)."""
        self._check_clip_skip(clip_skip)
        if not guidance:
            return self.encode([prompt], syntax, clip_skip)
        if negative_prompt is None and self.zeros_for_empty:
            positive = self.encode([prompt], syntax, clip_skip)
            pooled = positive.pooled
            return TextConditioning(
                np.concatenate([np.zeros_like(positive.hidden), positive.hidden]),
                None if pooled is None else np.concatenate([np.zeros_like(pooled), pooled]),
            )
        return self.encode([negative_prompt or "", prompt], syntax, clip_skip)

    # -- one prompt

    @property
    def _length(self) -> int:
        return self.tokenizers[self.family.text_encoders[0]].max_length

    def _encode_one(self, prompt: str, syntax: str, clip_skip: int | None) -> TextConditioning:
        from .prompt_weights import parse
        from .weighted_text import a1111_chunks, a1111_emphasis, compel_chunks, compel_weighted

        if not isinstance(prompt, str):
            raise ConfigError(f"prompts must be strings, not {type(prompt).__name__}", hint="pass a string")
        fragments = parse(expand(prompt, self.embeddings), syntax)
        hidden, pooled = [], None
        for name in self.family.text_encoders:
            tokenizer = self.tokenizers[name]
            if syntax == "compel":
                chunks = compel_chunks(tokenizer, fragments)
                states = self._states(name, chunks.ids, None, clip_skip)
                if chunks.weighted:
                    run = lambda ids, mask, name=name: self._states(name, ids, mask, clip_skip)[0]  # noqa: E731
                    empty = self._states(name, tokenizer([""]), None, clip_skip)[0][0]
                    hidden.append(compel_weighted(run, chunks, empty))
                else:
                    hidden.append(_flat(states[0], chunks.count))
                if self.family.pooled_output and name == self.family.text_encoders[-1]:
                    # compel reads the pooled state of the prompt as written (its syntax included), cut to 77
                    raw = self._states(name, tokenizer([expand(prompt, self.embeddings)]), None, clip_skip)
                    pooled = raw[1]
            else:
                chunks = a1111_chunks(tokenizer, fragments)
                states = self._states(name, chunks.ids, None, clip_skip)
                hidden.append(_flat(a1111_emphasis(states[0], chunks.weights), chunks.count))
                if self.family.pooled_output and name == self.family.text_encoders[-1]:
                    assert states[1] is not None
                    pooled = states[1][:1]  # A1111: the first chunk's
        return TextConditioning(np.concatenate(hidden, axis=-1).astype(np.float32)[None], pooled)

    def _states(
        self, name: str, ids: np.ndarray, mask: np.ndarray | None, clip_skip: int | None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """(hidden states [n, 77, width], pooled [n, width] or None) of `ids` [n, 77] through one encoder, in
        batches its engine's profile takes."""
        from enginefarm.families import ADDED_EMBEDS

        session = self.sessions[name]
        inputs = session.input_names
        if mask is not None and (mask != 1).any() and "attention_mask" not in inputs:
            raise ConfigError(
                f"{name} was exported before text encoders took an attention mask: compel's down-weighting "
                "(word-, (words)0.5) cannot run on it",
                hint="re-export the model with this enginefarm (`enginefarm export`) and build it, or use "
                'prompt_syntax="a1111"',
            )
        hidden, pooled = [], []
        step = _max_batch(session, "input_ids") or len(ids)
        for at in range(0, len(ids), step):
            part = ids[at : at + step]
            feeds = self.added[name].feeds(part, self.widths[name], ADDED_EMBEDS in inputs, name)
            if "attention_mask" in inputs:
                feeds["attention_mask"] = np.ones(part.shape, np.int64) if mask is None else mask[at : at + step]
            outputs = session.run(feeds)
            if clip_skip:
                # the stacked states of every layer; the pipeline's own output is the one `_SKIP_FROM` before the end
                hidden.append(outputs[LAYER_STATES][:, -(clip_skip + self._skip_from)])
            else:
                hidden.append(outputs[self.family.prompt_output])
            if self.family.pooled_output and self.family.pooled_output in outputs:
                pooled.append(outputs[self.family.pooled_output])
        return np.concatenate(hidden).astype(np.float32), np.concatenate(pooled) if pooled else None

    @property
    def _skip_from(self) -> int:
        """Where the pipeline's own output sits from the end of the layer stack: SD 1.x/2.x read the last layer
        (hidden_states[-1]), SDXL the penultimate (hidden_states[-2])."""
        return 1 if self.family.prompt_output == "last_hidden_state" else 2

    def _check_clip_skip(self, clip_skip: int | None) -> None:
        if clip_skip is None or clip_skip == 0:
            return
        if isinstance(clip_skip, bool) or not isinstance(clip_skip, int) or clip_skip < 0:
            raise ConfigError(f"clip_skip={clip_skip!r}", hint="a number of layers to skip: 1 or 2 (None: none)")
        for name in self.family.text_encoders:
            session = self.sessions[name]
            if LAYER_STATES not in session.output_names:
                raise ConfigError(
                    f"{name} was exported before text encoders gave every layer's states: it cannot take clip_skip",
                    hint="re-export the model with this enginefarm (`enginefarm export`) and build it",
                )
            layers = self.layers.get(name)  # the encoder's layers; its stack holds one more (the embeddings)
            if layers and clip_skip + self._skip_from > layers + 1:
                raise ConfigError(
                    f"clip_skip={clip_skip} is past {name}'s {layers} layers",
                    hint=f"use 1..{layers + 1 - self._skip_from}",
                )


LAYER_STATES = "layer_states"  # the text encoders' every-layer output (families/table.py), read for clip_skip


def _flat(states: np.ndarray, count: int) -> np.ndarray:
    """[chunks, 77, width] → [chunks·77, width]."""
    return states.reshape(count * states.shape[1], states.shape[2])


def _padded(encoded: TextConditioning, empty: np.ndarray, chunks: int) -> TextConditioning:
    missing = chunks - encoded.hidden.shape[1] // empty.shape[1]
    return TextConditioning(np.concatenate([encoded.hidden, *[empty] * missing], axis=1), encoded.pooled)


def _profile(session, name: str) -> dict | None:
    profile = getattr(getattr(session, "artifact", None), "profile", None) or {}
    return profile.get(name)


def _max_batch(session, name: str) -> int | None:
    bounds = _profile(session, name)
    return int(bounds["max"][0]) if bounds else None


def check_prompt_options(family, prompts: list[str | None], syntax: str, clip_skip: int | None) -> None:
    """Before any encoder runs: the syntax's name, and what the transformer families (SD3, Flux, Chroma) do not
    take. They read the prompt as written, as diffusers' pipelines for them do: weights in it are logged, once a
    call, not applied; clip_skip is refused."""
    from .prompt_weights import parse

    for prompt in prompts:
        if prompt is not None:
            weighted = any(w != 1 for _, w in parse(prompt, syntax))
            if weighted and family.denoiser == "transformer":
                log.warning(
                    "%s reads the prompt as written: its %s weights are not applied (prompt weighting is for "
                    "SD 1.x, 2.x and SDXL)",
                    family.title,
                    syntax,
                )
                break
    if clip_skip and family.denoiser == "transformer":
        raise ConfigError(
            f"clip_skip is for SD 1.x, 2.x and SDXL; {family.title}'s text encoders are exported without it",
            hint="leave clip_skip out",
        )


def check_prompt_tokens(family, sessions: dict, text: TextConditioning) -> None:
    """A long prompt's tokens against what the UNet engines were built for: an export from before long prompts
    takes one chunk of 77."""
    if family.denoiser == "transformer":
        return
    tokens = text.hidden.shape[1]
    for name in ("unet", "unet_controlnet", "controlnet"):
        bounds = _profile(sessions.get(name), "encoder_hidden_states")
        if bounds and tokens > bounds["max"][1]:
            raise ConfigError(
                f"the prompt is {tokens // TOKENS} chunks of {TOKENS} tokens; {family.title}'s {name} was built for "
                f"{bounds['max'][1] // TOKENS} ({bounds['max'][1]} tokens)",
                hint="shorten the prompt (or the negative prompt) to fit, or re-export the model with this enginefarm "
                "(`enginefarm export`: 4 chunks) and build it",
            )
