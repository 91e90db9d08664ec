"""Text tokenizers read from a model's own files, with the `tokenizers` package (Rust; imported when one is loaded).

The ids match transformers' tokenizers loaded from the same folder (the tests compare them), because that is what
the text encoders were exported and validated with:

- `ClipTokenizer`: OpenAI CLIP's byte-level BPE (`vocab.json` + `merges.txt`, or `tokenizer.json`), lower-cased
  with whitespace collapsed, `<|startoftext|>` ids `<|endoftext|>`, truncated and padded to `model_max_length` (77)
  with the folder's pad token: "<|endoftext|>" for SD 1.x, "!" (id 0) for SD 2.x and SDXL's second encoder.
  As in transformers, a pad token of "!" is a special token, so a "!" in a prompt also becomes id 0.
- `T5Tokenizer`: a `tokenizer.json` (SD3's and Flux's T5 encoders ship one): ids `</s>`, padded with `<pad>`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from enginefarm.errors import ConfigError, SourceError

# OpenAI CLIP's pre-tokenizer: the special tokens, English contractions, runs of letters, single digits, and runs of
# anything else that is not space
_CLIP_WORDS = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
_SPECIAL_ATTRS = ("bos_token", "eos_token", "unk_token", "pad_token")
CLIP_MAX_LENGTH = 77  # CLIP's text encoder has 77 positions; used when tokenizer_config.json does not say


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ConfigError(
            "the tokenizers package is not installed", hint="pip install 'enginefarm[diffusion]'"
        ) from None
    return tokenizers


class _FolderConfig:
    """tokenizer_config.json and special_tokens_map.json, resolved as transformers resolves them: special_tokens_map
    overrides the config's special tokens unless the config lists `added_tokens_decoder`; a token written as a plain
    string matches text before lower-casing, one written as a dict says so itself (`normalized`)."""

    def __init__(self, folder: Path):
        self.config = _read_json(folder / "tokenizer_config.json")
        self.decoder = {int(i): tok for i, tok in (self.config.get("added_tokens_decoder") or {}).items()}
        values = {k: self.config[k] for k in _SPECIAL_ATTRS if self.config.get(k) is not None}
        if not self.decoder:
            special_map = _read_json(folder / "special_tokens_map.json")
            values.update({k: special_map[k] for k in _SPECIAL_ATTRS if special_map.get(k) is not None})
        by_content = {tok["content"]: tok for tok in self.decoder.values()}
        self.specials = {}
        for attr, value in values.items():
            spec = {"content": value} if isinstance(value, str) else dict(value)
            self.specials[attr] = {**spec, **by_content.get(spec["content"], {})}

    def token(self, attr: str, default: str | None) -> str | None:
        spec = self.specials.get(attr)
        return spec["content"] if spec else default

    def max_length(self, default: int) -> int:
        value = self.config.get("model_max_length")
        # transformers writes a huge number when no limit is known
        return int(value) if isinstance(value, (int, float)) and 0 < value < 1e6 else default

    def register(self, tokenizer) -> None:
        """Make the special and saved added tokens match whole in text, as transformers does."""
        tk = _tokenizers()
        specials = {spec["content"]: spec for spec in self.specials.values()}
        for spec in specials.values():
            tokenizer.add_special_tokens([_added_token(tk, spec, special=True)])
        for idx in sorted(self.decoder):
            spec = self.decoder[idx]
            if spec["content"] in specials:
                continue
            token = _added_token(tk, spec, special=bool(spec.get("special")))
            (tokenizer.add_special_tokens if spec.get("special") else tokenizer.add_tokens)([token])
            if tokenizer.token_to_id(spec["content"]) != idx:
                raise SourceError(
                    f"tokenizer_config.json puts {spec['content']!r} at id {idx}, "
                    f"the vocabulary at {tokenizer.token_to_id(spec['content'])}",
                    hint="the tokenizer folder is inconsistent; re-export the model",
                )


def _added_token(tk, spec: dict, *, special: bool):
    return tk.AddedToken(
        spec["content"],
        single_word=bool(spec.get("single_word", False)),
        lstrip=bool(spec.get("lstrip", False)),
        rstrip=bool(spec.get("rstrip", False)),
        normalized=bool(spec.get("normalized", False)),
        special=special,
    )


@contextmanager
def _panics_said() -> Iterator[None]:
    """The tokenizers package panics on some inputs (a pre-tokenizer regex past its backtrack limit): pyo3's
    PanicException, a BaseException that escapes every `except Exception`. Said in one line instead."""
    try:
        yield
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":
            raise
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ConfigError(
            f"the tokenizer failed on this prompt ({first})",
            hint="its tokenizer.json's pre-tokenizer pattern cannot handle this text: shorten or change the prompt, "
            "or re-export the model with its original tokenizer",
        ) from None


def load_tokenizer_file(path: Path):
    """tokenizers' Tokenizer from a tokenizer.json; a file it cannot read (cut short, not JSON, a pattern it cannot
    compile) is a one-line SourceError naming it, not `Exception: EOF while parsing`."""
    tk = _tokenizers()
    try:
        with _panics_said():
            return tk.Tokenizer.from_file(str(path))
    except ConfigError as exc:
        raise SourceError(f"{path}: {exc.message}", hint="re-export the model with `enginefarm export`") from None
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise SourceError(
            f"{path}: not a tokenizer file the tokenizers package can read ({first})",
            hint="the file is damaged or cut short: re-export the model with `enginefarm export`",
        ) from None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SourceError(f"{path}: cannot read: {e}", hint="the tokenizer folder is damaged; re-download it") from None
    if not isinstance(data, dict):
        raise SourceError(f"{path}: expected a JSON object", hint="the tokenizer folder is damaged; re-download it")
    return data


class _Tokenizer:
    """Shared by the CLIP and T5 tokenizers: a `tokenizers.Tokenizer` without its own specials, truncation or padding
    (ours add those, so what a folder's tokenizer.json says about them cannot change the ids)."""

    def __init__(self, backend, *, max_length: int, bos_id: int | None, eos_id: int, pad_id: int):
        backend.no_truncation()
        backend.no_padding()
        self.backend = backend
        self.max_length = max_length
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """The ids of `text` alone: no start or end token, no truncation, no padding (for long-prompt chunking)."""
        with _panics_said():
            return self.backend.encode(text, add_special_tokens=False).ids

    def __call__(self, texts: str | Sequence[str], max_length: int | None = None) -> np.ndarray:
        """int64 ids [batch, max_length]: start token (CLIP), the text's ids truncated to fit, end token, padding."""
        if isinstance(texts, str):
            texts = [texts]
        if not all(isinstance(t, str) for t in texts):
            raise ConfigError("prompts must be strings", hint="pass a string or a list of strings")
        length = max_length or self.max_length
        head = [] if self.bos_id is None else [self.bos_id]
        room = length - len(head) - 1
        if room < 0:
            raise ConfigError(f"max_length {length} leaves no room for the start and end tokens", hint="use 77")
        out = np.full((len(texts), length), self.pad_id, dtype=np.int64)
        with _panics_said():
            encodings = self.backend.encode_batch(list(texts), add_special_tokens=False)
        for row, encoding in enumerate(encodings):
            ids = head + encoding.ids[:room] + [self.eos_id]
            out[row, : len(ids)] = ids
        return out

    def add_tokens(self, tokens: Sequence[str]) -> list[int]:
        """Add words (textual-inversion triggers) matched whole in any prompt, after lower-casing; new ones get the
        ids after the vocabulary, in order. Returns every token's id (an existing token keeps its own)."""
        tk = _tokenizers()
        if isinstance(tokens, str) or not all(isinstance(t, str) and t for t in tokens):
            raise ConfigError("tokens must be a list of non-empty strings", hint='e.g. add_tokens(["<cat-toy>"])')
        self.backend.add_tokens([tk.AddedToken(t, normalized=True) for t in tokens])
        return [self.backend.token_to_id(t) for t in tokens]

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)


class ClipTokenizer(_Tokenizer):
    @classmethod
    def from_folder(cls, folder: str | Path) -> ClipTokenizer:
        """A diffusers pipeline's `tokenizer/` (or `tokenizer_2/`) folder."""
        tk = _tokenizers()
        folder = Path(folder)
        cfg = _FolderConfig(folder)
        bos, eos = cfg.token("bos_token", "<|startoftext|>"), cfg.token("eos_token", "<|endoftext|>")
        unk, pad = cfg.token("unk_token", "<|endoftext|>"), cfg.token("pad_token", "<|endoftext|>")
        if (folder / "tokenizer.json").is_file():
            backend = load_tokenizer_file(folder / "tokenizer.json")
        elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
            backend = _clip_backend(tk, folder, unk or "<|endoftext|>")
        else:
            raise SourceError(
                f"{folder}: no tokenizer.json, nor vocab.json and merges.txt",
                hint="point at the pipeline's tokenizer folder",
            )
        cfg.register(backend)
        ids = {name: backend.token_to_id(tok) for name, tok in (("bos", bos), ("eos", eos), ("pad", pad))}
        missing = [name for name, i in ids.items() if i is None]
        if missing:
            raise SourceError(
                f"{folder}: the {', '.join(missing)} token is not in the vocabulary",
                hint="the tokenizer folder is inconsistent; re-export the model",
            )
        return cls(
            backend, max_length=cfg.max_length(CLIP_MAX_LENGTH), bos_id=ids["bos"], eos_id=ids["eos"], pad_id=ids["pad"]
        )


def _clip_backend(tk, folder: Path, unk: str):
    model = tk.models.BPE.from_file(
        str(folder / "vocab.json"),
        str(folder / "merges.txt"),
        unk_token=unk,
        continuing_subword_prefix="",
        end_of_word_suffix="</w>",
        fuse_unk=False,
    )
    backend = tk.Tokenizer(model)
    backend.normalizer = tk.normalizers.Sequence(
        [tk.normalizers.NFC(), tk.normalizers.Replace(tk.Regex(r"\s+"), " "), tk.normalizers.Lowercase()]
    )
    backend.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [
            tk.pre_tokenizers.Split(tk.Regex(_CLIP_WORDS), behavior="removed", invert=True),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    backend.decoder = tk.decoders.ByteLevel()
    return backend


class T5Tokenizer(_Tokenizer):
    """T5's SentencePiece unigram tokenizer from its `tokenizer.json`: ids then `</s>`, padded with `<pad>`. The
    pipelines choose the length (SD3: 256, Flux: 512), so `max_length` defaults to the folder's model_max_length."""

    @classmethod
    def from_folder(cls, folder: str | Path, max_length: int | None = None) -> T5Tokenizer:
        _tokenizers()  # the extra's install hint first
        folder = Path(folder)
        if not (folder / "tokenizer.json").is_file():
            hint = (
                "only tokenizer.json is read (spiece.model would need sentencepiece); re-save the tokenizer with "
                "transformers' save_pretrained"
            )
            raise SourceError(f"{folder}: no tokenizer.json", hint=hint)
        cfg = _FolderConfig(folder)
        backend = load_tokenizer_file(folder / "tokenizer.json")
        cfg.register(backend)
        eos, pad = (
            backend.token_to_id(cfg.token("eos_token", "</s>")),
            backend.token_to_id(cfg.token("pad_token", "<pad>")),
        )
        if eos is None or pad is None:
            raise SourceError(
                f"{folder}: the end or pad token is not in the vocabulary",
                hint="the tokenizer folder is inconsistent; re-export the model",
            )
        return cls(backend, max_length=max_length or cfg.max_length(512), bos_id=None, eos_id=eos, pad_id=pad)
