"""Property-based fuzzing (hypothesis) of everything that parses bytes a store or a user hands us: manifests, the
index, codec blobs, channel bindings, recipes. Whatever the input, each parser returns a typed object or raises its
one typed error; never another exception, never a hang, never memory out of proportion to the input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enginefarm.cache import weight_codec
from enginefarm.cache.index import IndexEntry, parse_index
from enginefarm.cache.manifest import Manifest
from enginefarm.cache.trust import binding
from enginefarm.errors import IntegrityError, RecipeError, TrustError
from tests.cache.test_store_conformance import make_manifest

# CI replays the same examples every run (a failure there is reproducible); a developer's run explores new ones.
FUZZ = settings(
    max_examples=int(os.environ.get("ENGINEFARM_FUZZ_EXAMPLES", "150")),
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=25,
)
VALID = make_manifest("fuzz", "a" * 64, 10).to_dict()


def mutated(base: dict):
    """`base` with some fields replaced, removed or added: near-valid inputs reach the deep checks."""
    keys = st.sampled_from(sorted(base) + ["extra"])
    return st.lists(st.tuples(keys, st.one_of(json_values, st.just("__drop__"))), max_size=4).map(
        lambda changes: {k: v for k, v in {**base, **dict(changes)}.items() if v != "__drop__"}
    )


@FUZZ
@given(st.one_of(mutated(VALID), json_values))
def test_manifest_from_dict_is_typed_or_an_integrity_error(data):
    try:
        manifest = Manifest.from_dict(data) if isinstance(data, dict) else Manifest.from_json(json.dumps(data).encode())
    except IntegrityError:
        return
    assert Manifest.from_json(manifest.to_json()) == manifest  # what parses, round-trips


@FUZZ
@given(st.binary(max_size=300))
def test_manifest_from_bytes_is_typed_or_an_integrity_error(raw):
    try:
        Manifest.from_json(raw)
    except IntegrityError:
        pass


GOOD_ENTRY = IndexEntry.of(make_manifest("fuzz", "a" * 64, 10)).to_dict()


@FUZZ
@given(st.dictionaries(st.text(max_size=70), st.one_of(mutated(GOOD_ENTRY), json_values), max_size=5), json_values)
def test_parse_index_keeps_only_valid_entries(entries, junk):
    entries = {**entries, GOOD_ENTRY["build_key"]: GOOD_ENTRY}
    for raw in (json.dumps({"format": 1, "model": "m", "entries": entries}).encode(), json.dumps(junk).encode()):
        index = parse_index(raw, "m")
        for key, entry in index.entries.items():
            assert isinstance(entry, IndexEntry) and entry.build_key == key
            assert IndexEntry.from_dict(entry.to_dict(), "m") == entry
    assert GOOD_ENTRY["build_key"] in parse_index(json.dumps({"format": 1, "entries": entries}).encode(), "m").entries


@FUZZ
@given(st.binary(max_size=2000))
def test_parse_index_of_any_bytes_never_raises(raw):
    assert isinstance(parse_index(raw, "m").entries, dict)


BLOB = weight_codec.compress(bytes(range(256)) * 64, "float32", frame_raw=4096)


@FUZZ
@given(
    st.lists(st.tuples(st.integers(0, len(BLOB) - 1), st.integers(0, 255)), min_size=1, max_size=8),
    st.integers(0, len(BLOB)),
)
def test_a_damaged_efw1_blob_decodes_right_or_is_an_integrity_error(flips, cut):
    data = bytearray(BLOB)
    for offset, value in flips:
        data[offset] = value
    data = bytes(data[:cut]) if cut < len(data) else bytes(data)
    try:
        out = bytes(weight_codec.decompress(data, 256 * 64))
    except IntegrityError:
        return
    assert (
        len(out) == 256 * 64
    )  # a flip that survives (in padding or an unused field) still decodes to the declared size


@FUZZ
@given(st.binary(max_size=400), st.integers(0, 1 << 40))
def test_efw1_decoding_of_any_bytes_is_an_integrity_error(raw, expected):
    import io

    with pytest.raises(IntegrityError):
        list(weight_codec.decode_frames(io.BufferedReader(io.BytesIO(weight_codec.MAGIC + raw)), expected or None))


@FUZZ
@given(json_values, st.sampled_from([None, {"channel": "stable", "repository": "0" * 32}]))
def test_binding_check_refuses_with_a_trust_error_or_passes(signed, trusted):
    raw = json.dumps({"signed": signed, "signatures": []}).encode()
    try:
        binding.check(raw, "stable", trusted, "fuzz")
    except TrustError as exc:
        assert exc.reason == "channel"


toml_keys = st.sampled_from(
    [
        "model",
        "name",
        "version",
        "defaults",
        "targets",
        "precisions",
        "components",
        "c",
        "source",
        "profiles",
        "default",
        "batch",
        "validate",
        "inputs",
        "min",
        "opt",
        "max",
        "min_cosine",
        "samples",
        "options",
        "resources",
    ]
)
toml_values = st.recursive(
    st.booleans()
    | st.integers(-5, 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | toml_keys,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(toml_keys, inner, max_size=4),
    max_leaves=20,
)
BASE_RECIPE = {
    "model": {"name": "m", "version": "1"},
    "defaults": {"targets": ["onnxruntime:cpu"]},
    "components": {"c": {"source": "m.onnx", "profiles": {"default": {"batch": [1, 1, 2]}}}},
}


def _deep_merge(base, change):
    if isinstance(base, dict) and isinstance(change, dict):
        return {**base, **{k: _deep_merge(base.get(k), v) for k, v in change.items()}}
    return change


@FUZZ
@given(st.dictionaries(toml_keys, toml_values, max_size=3))
def test_parse_recipe_is_a_recipe_or_a_recipe_error(tmp_path_factory, change):
    from enginefarm.builder.recipe import Recipe, parse_recipe

    folder = tmp_path_factory.mktemp("recipe")
    (folder / "m.onnx").write_bytes(b"")
    try:
        recipe = parse_recipe(_deep_merge(BASE_RECIPE, change), folder / "r.toml")
    except RecipeError as exc:
        assert str(exc).startswith(str(folder / "r.toml"))  # every error names the file
        return
    assert isinstance(recipe, Recipe)


@FUZZ
@given(st.text(max_size=300))
def test_load_recipe_of_any_text_is_a_recipe_or_a_recipe_error(tmp_path_factory, text):
    from enginefarm.builder.recipe import load_recipe

    path = Path(tmp_path_factory.mktemp("recipe")) / "r.toml"
    path.write_text(text)
    try:
        load_recipe(path)
    except RecipeError:
        pass
