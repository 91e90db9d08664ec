"""Our tokenizers against transformers' (the reference), both loaded from the same real-format folders."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enginefarm.diffusion.tokenizer import ClipTokenizer, T5Tokenizer
from enginefarm.errors import SourceError
from tests.diffusion_assets import clip_vocab, learn_merges, write_clip_tokenizer, write_t5_tokenizer

transformers = pytest.importorskip("transformers")

PROMPTS = [
    "a photo of a cat",
    "A  Photo\tOF\n a CAT's",
    "an astronaut riding a horse, 8k!!",
    "hello!",
    "!",
    "",
    "   ",
    "it's a dog's life, isn't it? we'll see; they're here, I'd go, you've been, I'm",
    "<|endoftext|> after the end",
    "<|ENDOFTEXT|> shouting",
    "<|startoftext|>twice<|startoftext|>",
    "café naïve façade über 日本 東京 🍜🐱 emoji",
    "(masterpiece:1.2), [best quality], {ultra-detailed}, #art @user $5 100% 3.14159",
    "ＦＵＬＬＷＩＤＴＨ ﬁ ligature",
    "word " * 100,
    "x" * 500,
    "Ünïcödé ÀÉÎÕÜ ß ẞ İstanbul",
    "tab\tnew\nline\r\nnbsp\u00a0thin\u2009space",
]

# (pad token, how tokenizer_config.json is written, whether a tokenizer.json is there too)
FOLDERS = [
    ("<|endoftext|>", "legacy", False),
    ("!", "legacy", False),
    ("<|endoftext|>", "decoder", False),
    ("!", "decoder", False),
    ("<|endoftext|>", "decoder", True),
    ("!", "legacy", True),
]


@pytest.fixture(
    scope="module", params=FOLDERS, ids=lambda p: f"pad{'!' if p[0] == '!' else 'EOT'}-{p[1]}{'-json' if p[2] else ''}"
)
def clip_folder(request, tmp_path_factory):
    pad, style, with_json = request.param
    return write_clip_tokenizer(tmp_path_factory.mktemp("tok"), pad, config_style=style, tokenizer_json=with_json)


def reference(folder):
    return transformers.CLIPTokenizer.from_pretrained(folder)


def reference_ids(tok, texts, max_length=77):
    return np.array(tok(list(texts), padding="max_length", max_length=max_length, truncation=True)["input_ids"])


def test_the_fixture_is_laid_out_as_clips_vocabulary():
    vocab = clip_vocab(learn_merges())
    assert vocab["!"] == 0 and vocab["!</w>"] == 256
    assert list(vocab)[-2:] == ["<|startoftext|>", "<|endoftext|>"]
    assert len(vocab) > 600 and any(len(token) > 4 and token.endswith("</w>") for token in list(vocab)[512:])


def test_prompts_match_transformers(clip_folder):
    ours, ref = ClipTokenizer.from_folder(clip_folder), reference(clip_folder)
    ids = ours(PROMPTS)
    assert ids.dtype == np.int64 and ids.shape == (len(PROMPTS), 77)
    np.testing.assert_array_equal(ids, reference_ids(ref, PROMPTS))
    assert ours.pad_id == ref.pad_token_id and ours.bos_id == ref.bos_token_id and ours.eos_id == ref.eos_token_id


def test_padding_follows_the_folders_pad_token(clip_folder):
    ours = ClipTokenizer.from_folder(clip_folder)
    pad = json.loads((clip_folder / "special_tokens_map.json").read_text())["pad_token"]["content"]
    assert ours.pad_id == (0 if pad == "!" else ours.eos_id)
    row = ours("a cat")[0]
    end = int(np.flatnonzero(row == ours.eos_id)[0])
    assert row[0] == ours.bos_id and (row[end + 1 :] == ours.pad_id).all()


def test_long_prompts_keep_their_start_and_end_tokens(clip_folder):
    ours = ClipTokenizer.from_folder(clip_folder)
    row = ours("a " * 100)[0]
    assert row[0] == ours.bos_id and row[-1] == ours.eos_id
    assert len(set(row[1:-1].tolist())) == 1
    assert len(ours.encode("a " * 100)) == 100  # encode() does not truncate


PROMPT_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=120) | st.text(
    st.sampled_from(list("abcdefghijklmnopqrstuvwxyz ABCXYZ!?.,'-:()[]0123456789\t\nçé日🍜")), max_size=200
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(PROMPT_TEXT, min_size=1, max_size=4))
def test_random_text_matches_transformers(clip_folder, texts):
    ours, ref = _cached(clip_folder)
    np.testing.assert_array_equal(ours(texts), reference_ids(ref, texts))


_CACHE = {}


def _cached(folder):
    if folder not in _CACHE:
        _CACHE[folder] = (ClipTokenizer.from_folder(folder), reference(folder))
    return _CACHE[folder]


@pytest.mark.parametrize("length", [16, 77])
def test_model_max_length_comes_from_the_config(tmp_path, length):
    folder = write_clip_tokenizer(tmp_path, "!", model_max_length=length)
    ours = ClipTokenizer.from_folder(folder)
    assert ours.max_length == length
    np.testing.assert_array_equal(ours(PROMPTS), reference_ids(reference(folder), PROMPTS, length))


ADDED_PROMPTS = [
    "a <cat-toy> on a table",
    "a <CAT-TOY> photo",
    "a<cat-toy>b",
    "sks dog",
    "asks",
    "<cat-toy><cat-toy>",
    "<cat-toy>_1 and <cat-toy>_2 together",
    "a photo of sks, a cat",
]


def test_added_tokens_get_the_ids_after_the_vocabulary_and_match_in_prompts(clip_folder):
    ours, ref = ClipTokenizer.from_folder(clip_folder), reference(clip_folder)
    size = len(ours)
    assert size == len(ref)
    new = ["<cat-toy>", "<cat-toy>_1", "<cat-toy>_2", "sks"]
    ids = ours.add_tokens(new)
    ref.add_tokens(new)
    assert ids == list(range(size, size + 4)) == ref.convert_tokens_to_ids(new)
    assert ours.add_tokens(["<cat-toy>"]) == [size]  # adding again changes nothing
    got = ours(ADDED_PROMPTS)
    np.testing.assert_array_equal(got, reference_ids(ref, ADDED_PROMPTS))
    assert size in got[0] and size in got[1] and size + 3 in got[3]


def test_tokens_added_and_saved_by_transformers_load_with_their_ids(tmp_path):
    ref = reference(write_clip_tokenizer(tmp_path / "orig", "!"))
    ref.add_tokens(["<cat-toy>", "<style-x>"])
    ref.save_pretrained(tmp_path / "saved")
    ours = ClipTokenizer.from_folder(tmp_path / "saved")
    assert ours.token_to_id("<style-x>") == ref.convert_tokens_to_ids("<style-x>")
    np.testing.assert_array_equal(
        ours(ADDED_PROMPTS + ["<style-x> art"]), reference_ids(ref, ADDED_PROMPTS + ["<style-x> art"])
    )


def test_a_folder_without_vocabulary_is_a_source_error(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(SourceError, match="vocab.json"):
        ClipTokenizer.from_folder(tmp_path)


def test_a_damaged_config_is_a_source_error(tmp_path):
    folder = write_clip_tokenizer(tmp_path)
    (folder / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(SourceError, match="tokenizer_config.json"):
        ClipTokenizer.from_folder(folder)


@pytest.fixture(scope="module")
def t5_folder(tmp_path_factory):
    return write_t5_tokenizer(tmp_path_factory.mktemp("t5"))


@pytest.mark.parametrize("length", [None, 16, 256])
def test_t5_matches_transformers(t5_folder, length):
    ours, ref = T5Tokenizer.from_folder(t5_folder), transformers.T5Tokenizer.from_pretrained(t5_folder)
    prompts = PROMPTS + ["<extra_id_0> sentinel", "UPPER lower Mixed"]
    got = ours(prompts, max_length=length)
    expected = np.array(
        ref(prompts, padding="max_length", max_length=length or ref.model_max_length, truncation=True)["input_ids"]
    )
    assert got.shape == (len(prompts), length or 512)
    np.testing.assert_array_equal(got, expected)
    assert got[0][list(got[0]).index(ours.eos_id) + 1 :].tolist() == [ours.pad_id] * (
        got.shape[1] - list(got[0]).index(ours.eos_id) - 1
    )


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(PROMPT_TEXT, min_size=1, max_size=3))
def test_t5_random_text_matches_transformers(texts):
    ours, ref = _t5_pair()
    expected = np.array(ref(texts, padding="max_length", max_length=64, truncation=True)["input_ids"])
    np.testing.assert_array_equal(ours(texts, max_length=64), expected)


_T5 = {}


def _t5_pair():
    if not _T5:
        import tempfile

        folder = write_t5_tokenizer(tempfile.mkdtemp(prefix="t5-"))
        _T5["pair"] = (T5Tokenizer.from_folder(folder), transformers.T5Tokenizer.from_pretrained(folder))
    return _T5["pair"]


def test_t5_needs_a_tokenizer_json(tmp_path):
    (tmp_path / "spiece.model").write_bytes(b"\0")
    with pytest.raises(SourceError, match="tokenizer.json"):
        T5Tokenizer.from_folder(tmp_path)


def test_a_truncated_tokenizer_json_is_one_line(tmp_path):
    """Before: `Exception: EOF while parsing` from the tokenizers package, at the first load of a published model."""
    folder = write_clip_tokenizer(tmp_path / "tok", tokenizer_json=True)
    whole = (folder / "tokenizer.json").read_bytes()
    (folder / "tokenizer.json").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(SourceError, match="tokenizer.json") as refused:
        ClipTokenizer.from_folder(folder)
    assert "\n" not in str(refused.value) and refused.value.hint


def test_a_pre_tokenizer_regex_past_the_backtrack_limit_is_one_line(tmp_path):
    """The tokenizers package panics (pyo3's PanicException, a BaseException that escapes `except Exception`)."""
    import tokenizers as tk

    from enginefarm.errors import ConfigError

    vocab = {"a": 0, "c": 1, "<|startoftext|>": 2, "<|endoftext|>": 3}
    backend = tk.Tokenizer(tk.models.WordLevel(vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = tk.pre_tokenizers.Split(tk.Regex(r"(a|a)+b|(a+)+$x"), behavior="isolated")
    (tmp_path / "tok").mkdir()
    backend.save(str(tmp_path / "tok" / "tokenizer.json"))
    tokenizer = ClipTokenizer.from_folder(tmp_path / "tok")
    assert tokenizer(["a c"]).shape == (1, 77)  # an ordinary prompt is tokenized
    with pytest.raises(ConfigError, match="the tokenizer failed on this prompt") as refused:
        tokenizer(["a" * 5000 + "c"])
    assert refused.value.hint
    with pytest.raises(ConfigError, match="the tokenizer failed on this prompt"):
        tokenizer.encode("a" * 5000 + "c")
