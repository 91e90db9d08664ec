"""Textual inversion without a rebuild: an embedding file adds words to the tokenizers and rows to the text encoders.

The exported text encoders take `added_embeds` beside `input_ids` (families/table.py): at a position whose id is past
the encoder's token table (its `vocab_size` rows), the row is read from `added_embeds` instead of the table. So the
pipeline gives each added vector an id from `vocab_size` on, as diffusers' grown table does, and puts the vectors at
those positions; the engine, its build and its cache are the same for every set of embeddings.

Formats (safetensors, as model sites ship them):
- `emb_params` (A1111's .pt converted) or `string_to_param.*`: one [n, width] tensor; its word is the file's stem;
- `<token>` (diffusers' learned_embeds): one tensor named after its word;
- `clip_l` + `clip_g` (SDXL, SD3/SD3.5): one tensor per CLIP encoder; its word is the file's stem;
- Flux.1: one tensor or `clip_l`, for its CLIP-L; T5 sees the word as text, as diffusers' FluxPipeline does.
Vectors for T5 (`t5`, `t5xxl`: Flux/SD3 trainers may write them) are refused: T5's table has no added rows.
A tensor of n vectors is n words: `tok`, `tok_1` … `tok_{n-1}`, and `tok` in a prompt becomes all of them, as
diffusers' `load_textual_inversion` does."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enginefarm.errors import ConfigError, WeightsError

EmbeddingSpec = str | Path | tuple[str | Path, str]  # a file (its word from the file or its name) or (file, word)
MAX_VECTORS = 75  # a prompt has 77 positions, two of them the start and end tokens
ABSURD = 1e6  # as for custom weights (runner/custom.py): no trained embedding comes near it
SDXL_KEYS = {"clip_l": "text_encoder", "clip_g": "text_encoder_2"}  # an SDXL/SD3 pair's tensor → the encoder it is for
T5_KEYS = ("t5", "t5xxl", "t5_xxl")
_ONE_TENSOR_STEM = ("emb_params", "string_to_param.*", "string_to_param")  # A1111: the word is the file's name


@dataclass(frozen=True)
class Embedding:
    path: Path
    word: str
    vectors: dict[str, np.ndarray]  # text encoder component → float32 [n, width]

    @property
    def words(self) -> list[str]:
        count = len(next(iter(self.vectors.values())))
        return [self.word] + [f"{self.word}_{i}" for i in range(1, count)]


def read_embedding(item: EmbeddingSpec, widths: dict[str, int], t5: tuple[str, ...] = ()) -> Embedding:
    """`item`: FILE, or (FILE, WORD) to choose the word. `widths`: each of the model's CLIP text encoders → its
    width; `t5`: its T5 encoders (they take no embeddings). Everything wrong is one WeightsError naming the file,
    before anything is loaded."""
    path, word = (item, None) if isinstance(item, (str, Path)) else _pair(item)
    path = Path(path)
    from enginefarm.formats.safetensors_io import FLOATS, SafeTensors

    st = SafeTensors(path)  # a lying header is refused here
    names = st.names

    def refuse(problem: str, hint: str = "") -> WeightsError:
        return WeightsError(f"{path}: {problem}", hint=hint or "a textual-inversion embedding for this model's family")

    if any(n in T5_KEYS for n in names) or not widths:
        held = ", ".join(n for n in names if n in T5_KEYS) or names[0]
        raise refuse(
            f"vectors for T5 ({held}): textual inversion reaches the CLIP encoders only"
            if widths
            else f"this model's only text encoder is T5 ({', '.join(t5)}): textual inversion reaches CLIP encoders "
            "only",
            "use an embedding with clip_l (and clip_g) tensors only"
            if widths
            else "load the model without embeddings=",
        )
    if set(names) == {"clip_l"} and list(widths) == ["text_encoder"]:  # Flux's CLIP-L, named as SDXL's first
        tensors, word = {"text_encoder": "clip_l"}, word or path.stem
    elif set(names) == set(SDXL_KEYS):
        wanted = [n for n in SDXL_KEYS if SDXL_KEYS[n] in widths]
        if "text_encoder_2" not in widths or set(widths) - set(
            SDXL_KEYS.values()
        ):  # clip_l alone is not SD 1.x's vectors
            raise refuse(
                "an SDXL embedding (clip_l + clip_g), for a model with another text encoder",
                "use an embedding made for this model's family (SD 1.x/2.x: one tensor)",
            )
        tensors = {SDXL_KEYS[n]: n for n in wanted}
        word = word or path.stem
    elif len(names) == 1:
        if len(widths) != 1:
            raise refuse(
                f"one tensor ({names[0]!r}): an SD 1.x/2.x embedding; this model has {len(widths)} text encoders",
                "SDXL embeddings hold clip_l and clip_g",
            )
        tensors = {next(iter(widths)): names[0]}
        word = word or (path.stem if names[0] in _ONE_TENSOR_STEM else names[0])
    else:
        raise refuse(
            f"not a textual-inversion embedding (tensors {sorted(names)[:4]})",
            "an embedding holds one tensor (emb_params, or its word) or SDXL's clip_l and clip_g",
        )
    vectors = {}
    for encoder, name in tensors.items():
        entry = st.entries[name]
        if entry.dtype not in FLOATS:
            raise refuse(f"{name} is {entry.dtype}, not a float tensor")
        value = st.array(name)
        value = value[None] if value.ndim == 1 else value
        if value.ndim != 2 or not 1 <= len(value) <= MAX_VECTORS:
            raise refuse(
                f"{name} has shape {list(entry.shape)}; an embedding is [vectors, width] with 1 to {MAX_VECTORS} "
                "vectors"
            )
        if value.shape[1] != widths[encoder]:
            raise refuse(
                f"{name} is {value.shape[1]} wide, this model's {encoder} is {widths[encoder]} wide: an embedding for "
                "another model",
                "SD 1.x embeddings are 768 wide, SD 2.x 1024, SDXL 768 (clip_l) + 1280 (clip_g)",
            )
        if not np.isfinite(value).all() or np.abs(value).max() > ABSURD:
            raise refuse(
                f"{name} holds non-finite or absurd values (NaN, Inf, or past ±{ABSURD:g})", "re-download the file"
            )
        vectors[encoder] = np.ascontiguousarray(value, dtype=np.float32)
    if len({len(v) for v in vectors.values()}) > 1:
        raise refuse(f"its tensors hold different numbers of vectors ({ {k: len(v) for k, v in vectors.items()} })")
    if not isinstance(word, str) or not word.strip() or any(c.isspace() for c in word):
        raise ConfigError(
            f"embedding {path}: word {word!r} must be one word without spaces",
            hint=f'embeddings=[("{path}", "<my-word>")]',
        )
    return Embedding(path, word, vectors)


def _pair(item) -> tuple[str | Path, str]:
    try:
        path, word = item
    except (TypeError, ValueError):
        raise ConfigError(
            f"embedding {item!r} is neither a path nor (path, word)",
            hint='embeddings=["a.safetensors", ("b.safetensors", "<b>")]',
        ) from None
    return path, word


@dataclass
class AddedRows:
    """One text encoder's added words: tokenizer id → row of `added_embeds`; ids from `rows` on reach the graph."""

    rows: int  # the encoder's token table: ids below it are the vocabulary
    vectors: dict[int, np.ndarray] = field(default_factory=dict)  # tokenizer id → [width]

    def feeds(self, ids: np.ndarray, width: int, takes_added: bool, what: str) -> dict[str, np.ndarray]:
        """The encoder's inputs for tokenizer ids: added words moved past the table, their vectors beside them. Ids
        that are neither vocabulary nor added words are refused in one line (OpenVINO would read zeros for them,
        ONNX Runtime fail with a message about shapes)."""
        from enginefarm.families import ADDED_EMBEDS

        ids = np.asarray(ids, dtype=np.int64)
        added = np.isin(ids, list(self.vectors)) if self.vectors else np.zeros(ids.shape, bool)
        outside = ((ids < 0) | (ids >= self.rows)) & ~added
        if outside.any():
            raise ConfigError(
                f"{what}: token ids {sorted(set(ids[outside].tolist()))[:5]} are outside its vocabulary of {self.rows}",
                hint="the tokenizer does not belong to this text encoder: re-export the model, or load the embedding "
                "that adds them",
            )
        if not takes_added:
            if added.any():
                raise ConfigError(
                    f"{what} was exported before text encoders took added_embeds: it cannot take textual-inversion "
                    "words",
                    hint="re-export the model with this enginefarm (`enginefarm export`) and build it",
                )
            return {"input_ids": ids}
        order = sorted(self.vectors)
        fed = ids.copy()
        embeds = np.zeros((*ids.shape, width), np.float32)
        for slot, token in enumerate(order):
            where = ids == token
            fed[where] = self.rows + slot
            embeds[where] = self.vectors[token]
        return {"input_ids": fed, ADDED_EMBEDS: embeds}


def refuse_known_words(embeddings: list[Embedding], tokenizers) -> None:
    """Refuse the whole list (before anything is added) when a word is already one of `tokenizers`' tokens or is
    given twice: a word is one token, and two vectors for it could not both be meant."""
    words = [w for e in embeddings for w in e.words]
    known = [w for w in words if any(t.token_to_id(w) is not None for t in tokenizers)]
    if known or len(set(words)) < len(words):
        clash = known or sorted({w for w in words if words.count(w) > 1})
        raise ConfigError(
            f"textual-inversion word(s) {clash[:3]} already in the tokenizer or given twice",
            hint='choose another word: embeddings=[("file.safetensors", "<my-word>")]',
        )


def expand(prompt: str, embeddings: list[Embedding]) -> str:
    """A multi-vector word in a prompt becomes its n words (`tok` → `tok tok_1 … tok_{n-1}`), as diffusers'
    `maybe_convert_prompt` does."""
    for embedding in embeddings:
        if len(embedding.words) > 1 and embedding.word in prompt:
            prompt = prompt.replace(embedding.word, " ".join(embedding.words))
    return prompt
