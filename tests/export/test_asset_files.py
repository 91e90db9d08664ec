"""An export copies tokenizers, the scheduler config and model_index.json as they are, and `build` publishes them:
only regular files inside the source folder (or a Hugging Face snapshot's blobs/) are copied; a link elsewhere is
refused in one line before anything is exported (export/asset_files.py)."""

from __future__ import annotations

import os
import shutil

import pytest

from enginefarm.errors import ConfigError
from enginefarm.export.asset_files import check_assets
from enginefarm.export.run import ASSET_FOLDERS, _copy_assets
from enginefarm.export.source import read_source
from tests.conftest import run_cli
from tests.export.test_errors import _one_line_error


@pytest.fixture
def hostile(tiny, tmp_path):
    """The tiny SD 1.x pipeline, its tokenizer folder holding a link to a secret outside it."""
    source = tmp_path / "source"
    shutil.copytree(tiny("sd1"), source)
    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key = hunter2\n")
    os.symlink(secret, source / "tokenizer" / "added_tokens.json")
    return source


def test_a_link_out_of_the_source_is_never_copied_as_an_asset(hostile, tmp_path):
    with pytest.raises(ConfigError, match="tokenizer/added_tokens.json in the source is a link to .*credentials") as e:
        _copy_assets(read_source(hostile), tmp_path / "assets")
    assert e.value.hint
    assert "hunter2" not in "".join(p.read_text() for p in (tmp_path / "assets").rglob("*") if p.is_file())


def test_export_refuses_it_in_one_line_before_anything_is_exported(hostile, tmp_path):
    out = tmp_path / "out"
    err = _one_line_error(run_cli("export", str(hostile), "--out", str(out)))
    assert "outside the source folder" in err and "hint: " in err
    assert not out.exists() and not any(p.name.startswith(".out") for p in tmp_path.iterdir())


def test_a_fifo_or_a_linked_folder_out_of_the_source_is_refused(tiny, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(tiny("sd1"), source)
    os.mkfifo(source / "tokenizer" / "special_tokens_map.fifo")
    with pytest.raises(ConfigError, match="is not a regular file"):
        check_assets(source, ASSET_FOLDERS)
    os.unlink(source / "tokenizer" / "special_tokens_map.fifo")
    (tmp_path / "home").mkdir()
    os.symlink(tmp_path / "home", source / "tokenizer_2")
    with pytest.raises(ConfigError, match="tokenizer_2 in the source is a link to"):
        check_assets(source, ASSET_FOLDERS)


def test_links_inside_the_source_and_a_snapshots_blobs_are_copied(tiny, tmp_path):
    """A Hugging Face cache snapshot is all links into ../../blobs; a folder may link one of its own files."""
    repo = tmp_path / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abc"
    shutil.copytree(tiny("sd1"), snapshot)
    (repo / "blobs").mkdir()
    for path in sorted((snapshot / "tokenizer").iterdir()):
        blob = repo / "blobs" / f"blob-{path.name}"
        os.replace(path, blob)
        os.symlink(os.path.relpath(blob, path.parent), path)
    os.symlink("tokenizer.json", snapshot / "tokenizer" / "copy.json")
    _copy_assets(read_source(snapshot), tmp_path / "assets")
    copied = tmp_path / "assets" / "tokenizer"
    assert not any(p.is_symlink() for p in copied.iterdir())
    assert (copied / "copy.json").read_bytes() == (repo / "blobs" / "blob-tokenizer.json").read_bytes()
    assert (copied / "tokenizer.json").read_bytes() == (tiny("sd1") / "tokenizer" / "tokenizer.json").read_bytes()


def test_a_tokenizer_cut_short_is_refused_at_export_not_at_the_first_load(tiny, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(tiny("sd1"), source)
    whole = (source / "tokenizer" / "tokenizer.json").read_bytes()
    (source / "tokenizer" / "tokenizer.json").write_bytes(whole[: len(whole) // 2])
    out = tmp_path / "out"
    err = _one_line_error(run_cli("export", str(source), "--out", str(out)))
    assert "tokenizer.json: not a tokenizer file" in err and not out.exists()
