"""Weighted and long prompts for the CLIP encoders: (text, weight) fragments to 77-token chunks, and the two ways of
applying the weights to an encoder's hidden states (numpy; the encoder runs are the caller's `run`).

Chunks are laid out as CLIP's tokenizer lays out one prompt: start token, up to 75 ids, end token, padding. A prompt
of up to 75 tokens is one chunk whose ids are the tokenizer's, so an unweighted short prompt encodes exactly as
diffusers encodes it. Longer prompts are cut into several chunks, encoded one by one and concatenated on the token
axis:
- A1111: at 75 tokens, or after the last comma when one is within the last 20 tokens (its `comma_padding_backtrack`
  default); BREAK ends a chunk early.
- compel (`Compel`'s default `SplitLongTextMode.SENTENCES`): after the last `.` in the chunk's 75 tokens, else the
  last `.` `,` `;` `:`, else the last word end, else at 75. (Its EmbeddingsProvider's default adds
  COPY_FIRST_CLS_TOKEN; `Compel` itself does not pass it, and Easy Diffusion uses `Compel`.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .prompt_weights import BREAK

A1111_COMMA_BACKTRACK = 20
COMPEL_SENTENCE = (".</w>",)
COMPEL_PHRASE = (".</w>", ",</w>", ";</w>", ":</w>")
COMPEL_EPSILON = 1e-5  # compel's floor for a weight before tan()

# run(ids [n, 77], attention mask [n, 77] or None) → hidden states [n, 77, width]
Run = Callable[[np.ndarray, "np.ndarray | None"], np.ndarray]


@dataclass(frozen=True)
class Chunks:
    """A prompt's chunks: ids and per-token weights [chunks, length]; `spans`: each fragment's first and last token
    (flat positions over the chunks) with its weight, for compel's down-weighting."""

    ids: np.ndarray
    weights: np.ndarray
    spans: tuple[tuple[int, int, float], ...] = ()

    @property
    def count(self) -> int:
        return len(self.ids)

    @property
    def weighted(self) -> bool:
        return bool((self.weights != 1).any())


def _layout(tokenizer, pieces: list[tuple[list[int], list[float]]]) -> tuple[np.ndarray, np.ndarray]:
    """Each piece (≤ max_length - 2 ids) as start, ids, end, padding."""
    length = tokenizer.max_length
    ids = np.full((len(pieces), length), tokenizer.pad_id, np.int64)
    weights = np.ones((len(pieces), length), np.float32)
    for row, (piece, piece_weights) in enumerate(pieces):
        ids[row, 0] = tokenizer.bos_id
        ids[row, 1 : 1 + len(piece)] = piece
        ids[row, 1 + len(piece)] = tokenizer.eos_id
        weights[row, 1 : 1 + len(piece)] = piece_weights
    return ids, weights


def a1111_chunks(tokenizer, fragments: list[tuple[str, float]]) -> Chunks:
    """A1111's `tokenize_line`: fragments tokenized one by one, cut into chunks of 75 (a comma near the end moves
    what follows it to the next chunk; BREAK starts a new chunk)."""
    room = tokenizer.max_length - 2
    comma = tokenizer.token_to_id(",</w>")
    pieces: list[tuple[list[int], list[float]]] = []
    ids: list[int] = []
    weights: list[float] = []
    last_comma = -1

    def close() -> None:
        nonlocal ids, weights, last_comma
        pieces.append((ids, weights))
        ids, weights, last_comma = [], [], -1

    for text, weight in fragments:
        if weight == BREAK:
            close()
            continue
        for token in tokenizer.encode(text):
            if token == comma:
                last_comma = len(ids)
            elif len(ids) == room and last_comma != -1 and len(ids) - last_comma <= A1111_COMMA_BACKTRACK:
                cut = last_comma + 1
                moved, moved_weights = ids[cut:], weights[cut:]
                ids, weights = ids[:cut], weights[:cut]
                close()
                ids, weights = moved, moved_weights
            if len(ids) == room:
                close()
            ids.append(token)
            weights.append(weight)
    if ids or not pieces:
        close()
    return Chunks(*_layout(tokenizer, pieces))


def compel_chunks(tokenizer, fragments: list[tuple[str, float]]) -> Chunks:
    """compel's `get_token_ids_and_expand_weights` with `truncate=False`: the fragments' ids in one run, cut where
    compel's SENTENCES mode cuts; each fragment's span kept for down-weighting."""
    room = tokenizer.max_length - 2
    all_ids: list[int] = []
    all_weights: list[float] = []
    owners: list[int] = []  # the fragment of each id
    for index, (text, weight) in enumerate(fragments):
        fragment_ids = tokenizer.encode(text)
        all_ids += fragment_ids
        all_weights += [weight] * len(fragment_ids)
        owners += [index] * len(fragment_ids)
    pieces: list[tuple[list[int], list[float]]] = []
    positions: list[int] = []  # the flat position of each id in the chunked layout
    start = 0
    while True:
        rest = all_ids[start:]
        cut = len(rest) if len(rest) <= room else _compel_split(tokenizer, rest[:room])
        pieces.append((rest[:cut], all_weights[start : start + cut]))
        base = (len(pieces) - 1) * tokenizer.max_length + 1
        positions += range(base, base + cut)
        start += cut
        if start >= len(all_ids):
            break
    spans = []
    for index, (_, weight) in enumerate(fragments):
        mine = [p for p, owner in zip(positions, owners, strict=True) if owner == index]
        if mine:
            spans.append((mine[0], mine[-1], float(weight)))
    return Chunks(*_layout(tokenizer, pieces), spans=tuple(spans))


def _compel_split(tokenizer, window: list[int]) -> int:
    """Where compel cuts a run longer than a chunk: after the window's last sentence end, else phrase end, else
    word end; else the whole window."""
    texts = [tokenizer.backend.id_to_token(i) or "" for i in window]
    for ends in (COMPEL_SENTENCE, COMPEL_PHRASE, None):
        for index in range(len(texts) - 1, -1, -1):
            if texts[index] in ends if ends else texts[index].endswith("</w>"):
                return index + 1
    return len(window)


def a1111_emphasis(hidden: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """A1111's original emphasis, per chunk: the states times each token's weight, rescaled so their mean is the
    unweighted mean. `hidden` [chunks, 77, width], `weights` [chunks, 77]."""
    out = hidden.copy()
    for row in range(len(hidden)):
        if (weights[row] != 1).any():
            before = hidden[row].mean()
            scaled = hidden[row] * weights[row][:, None]
            out[row] = scaled * (before / scaled.mean())
    return out


def compel_weighted(run: Run, chunks: Chunks, empty: np.ndarray) -> np.ndarray:
    """compel's `get_embeddings_for_weighted_prompt_fragments` (DownweightMode.MASK, truncate=False): up-weights
    push each token's state away from the empty prompt's (`empty` [77, width]); each down-weighted fragment adds a
    run with that fragment masked out of attention, blended in by tan((1 - weight)·π/2). Returns [chunks·77, width]."""
    length = chunks.ids.shape[1]
    ones = np.ones(chunks.ids.shape, np.int64)

    def build(mask: np.ndarray) -> np.ndarray:
        hidden = run(chunks.ids, mask)
        weights = chunks.weights[:, :, None]
        pushed = empty[None] + (hidden - empty[None]) * weights
        return np.where(weights == 1, hidden, pushed).reshape(-1, hidden.shape[-1])

    states, blend = [build(ones)], [1.0]
    for start, end, weight in chunks.spans:
        if weight >= 1:
            continue
        mask = ones.reshape(-1).copy()
        mask[start : end + 1] = 0
        mask[0::length] = 1  # compel keeps every chunk's first and last position
        mask[length - 1 :: length] = 1
        states.append(build(mask.reshape(ones.shape)))
        blend.append(math.tan((1.0 - max(COMPEL_EPSILON, weight)) * math.pi / 2))
    factors = np.asarray(blend, np.float32) / np.float32(sum(blend))
    lerped = sum(s * f for s, f in zip(states, factors, strict=True)) if len(states) > 1 else states[0]
    return lerped.astype(np.float32)
