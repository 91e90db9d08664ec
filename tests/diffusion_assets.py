"""Small but real-format model files for the diffusion runtime's tests (no download).

`write_clip_tokenizer` writes a diffusers pipeline's `tokenizer/` folder: a byte-level BPE vocabulary laid out as
OpenAI's CLIP lays out its 49408 entries (the 256 byte symbols, the same with `</w>`, one entry per merge, then
`<|startoftext|>` and `<|endoftext|>`; so "!" is id 0), with merges learned from a small prompt corpus.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from itertools import pairwise
from pathlib import Path

import numpy as np

CORPUS = """
a photo of a cat sitting on a windowsill, highly detailed, 8k, trending on artstation
an astronaut riding a horse on the moon, digital art, masterpiece, best quality
portrait of a beautiful woman, oil painting by greg rutkowski, dramatic lighting
a cozy cabin in the snowy mountains at sunset, cinematic, ultra realistic, 4k
the quick brown fox jumps over the lazy dog; it's a dog's life, isn't it? we'll see
a bowl of fruit, still life, studio photography, soft light, sharp focus
café naïve façade über smörgåsbord 日本 東京 ramen 🍜 🐱 emoji
watercolor landscape with a river and trees, impressionism, by claude monet
cyberpunk city at night, neon lights, rain, reflections, blade runner style
a cute corgi wearing sunglasses, 3d render, pixar style, octane render
"""

SPECIALS = ("<|startoftext|>", "<|endoftext|>")
_WORDS = re.compile(r"[^\W\d_]+|\d|[^\s\w]+")


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins byte-level BPE uses for bytes: printable Latin-1 maps to itself, the rest (control
    characters, space, ...) to code points from 256 up, in byte order. Ordered as CLIP's vocabulary orders them."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    stand_in = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in stand_in:
            stand_in[b] = chr(256 + extra)
            extra += 1
    return [stand_in[b] for b in printable] + [stand_in[b] for b in range(256) if b not in printable]


def _byte_map() -> dict[int, str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    order = printable + [b for b in range(256) if b not in printable]
    return dict(zip(order, byte_symbols(), strict=True))


def learn_merges(corpus: str = CORPUS, count: int = 160) -> list[tuple[str, str]]:
    """A plain BPE trainer: repeatedly merge the most frequent adjacent pair (ties by the pair itself)."""
    bmap = _byte_map()
    words = Counter()
    for word in _WORDS.findall(corpus.lower()):
        symbols = [bmap[b] for b in word.encode("utf-8")]
        symbols[-1] += "</w>"
        words[tuple(symbols)] += 1
    merges = []
    for _ in range(count):
        pairs = Counter()
        for symbols, n in words.items():
            for pair in pairwise(symbols):
                pairs[pair] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = Counter()
        for symbols, n in words.items():
            out, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return merges


def clip_vocab(merges: list[tuple[str, str]]) -> dict[str, int]:
    base = byte_symbols()
    entries = base + [s + "</w>" for s in base] + ["".join(m) for m in merges] + list(SPECIALS)
    return {token: i for i, token in enumerate(dict.fromkeys(entries))}


def write_clip_tokenizer(
    folder,
    pad_token: str = "<|endoftext|>",
    *,
    model_max_length: int = 77,
    config_style: str = "decoder",
    tokenizer_json: bool = False,
) -> Path:
    """A CLIP tokenizer folder as diffusers pipelines ship it: vocab.json, merges.txt, tokenizer_config.json,
    special_tokens_map.json. SD 1.x pads with "<|endoftext|>", SD 2.x and SDXL's second tokenizer with "!".

    `config_style` "decoder" writes tokenizer_config.json as recent transformers saves it (with
    `added_tokens_decoder`), "legacy" as older ones did (special tokens as AddedToken dicts, no decoder).
    `tokenizer_json` also writes the fast tokenizer's tokenizer.json (built with the `tokenizers` package)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    merges = learn_merges()
    vocab = clip_vocab(merges)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    specials = {
        "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "pad_token": pad_token,
    }
    config = {
        "tokenizer_class": "CLIPTokenizer",
        "model_max_length": model_max_length,
        "do_lower_case": True,
        "errors": "replace",
        "clean_up_tokenization_spaces": True,
    }
    if config_style == "legacy":
        config.update(
            {
                k: {
                    "__type": "AddedToken",
                    "content": v,
                    "lstrip": False,
                    "normalized": True,
                    "rstrip": False,
                    "single_word": False,
                }
                for k, v in specials.items()
            }
        )
    else:
        config.update(specials)
        config["added_tokens_decoder"] = {
            str(vocab[t]): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t in dict.fromkeys([*SPECIALS, pad_token])
        }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    special_map = {
        k: {"content": v, "lstrip": False, "normalized": True, "rstrip": False, "single_word": False}
        for k, v in specials.items()
    }
    (folder / "special_tokens_map.json").write_text(
        json.dumps(special_map, indent=2, ensure_ascii=False), encoding="utf-8"
    )
    if tokenizer_json:
        from transformers import CLIPTokenizer

        CLIPTokenizer.from_pretrained(folder).backend_tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def write_t5_tokenizer(folder, *, model_max_length: int = 512, extra_ids: int = 3) -> Path:
    """A T5 tokenizer folder as SD3's `tokenizer_3/` and Flux's `tokenizer_2/` ship it, with a tokenizer.json: a
    SentencePiece unigram model over whole words, word pieces and single characters of the prompt corpus (the real
    one also has a precompiled normalization table, which this one leaves out)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    words = Counter(_WORDS.findall(CORPUS.lower()))
    pieces = Counter()
    for word, n in words.items():
        pieces["▁" + word] += 4 * n
        for size in (2, 3):
            for i in range(len(word) - size + 1):
                pieces[word[i : i + size]] += n
        for ch in word:
            pieces[ch] += n
            pieces["▁" + ch] += 1
    total = sum(pieces.values())
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    vocab += [(p, float(np.log(n / total))) for p, n in sorted(pieces.items(), key=lambda kv: (-kv[1], kv[0]))]
    extra = [f"<extra_id_{i}>" for i in reversed(range(extra_ids))]
    vocab += [(e, 0.0) for e in extra]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<pad>", "</s>", "<unk>", *extra)])
    tok.save(str(folder / "tokenizer.json"))
    ids = {t: i for i, (t, _) in enumerate(vocab)}
    config = {
        "tokenizer_class": "T5Tokenizer",
        "model_max_length": model_max_length,
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "extra_ids": extra_ids,
        "additional_special_tokens": extra,
        "added_tokens_decoder": {
            str(ids[t]): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t in ("<pad>", "</s>", "<unk>", *extra)
        },
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    special_map = {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>", "additional_special_tokens": extra}
    (folder / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2), encoding="utf-8")
    return folder
