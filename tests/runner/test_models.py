"""`enginefarm.models(store=...)` and `ls --models`: each model's family, versions, targets and download size here,
from the store's index alone, on the session's tiny SD 1.x build."""

from __future__ import annotations

import json

import pytest

import enginefarm
from enginefarm.cache.index import read_index
from enginefarm.cache.stores import open_store


@pytest.mark.slow
def test_models_lists_family_versions_targets_and_what_this_device_downloads(built, cli):
    _, export, store = built("sd1")
    found = {m.name: m for m in enginefarm.models(store=str(store))}
    entries = [
        e
        for name in open_store(str(store)).list_models()
        for e in read_index(open_store(str(store)), name).entries.values()
    ]
    (model,) = [m for m in found.values() if m.components and "unet" in m.components]
    assert model.family == "sd1"  # not "sd1 | controlnet-sd1": no ControlNet is built
    own = [e for e in entries if e.model == model.name]
    assert set(model.targets) == {e.target for e in own} and len(model.targets) >= 2
    assert model.versions and model.runs_here and not model.missing
    # one artifact per component: more than the smallest choice, less than every artifact together
    per_component = {}
    for e in own:
        per_component.setdefault(e.component, []).append(e.stored_size or e.size)
    assert (
        sum(min(v) for v in per_component.values())
        <= model.download_bytes
        <= sum(max(v) for v in per_component.values())
    )
    assert model.download_bytes < sum(sum(v) for v in per_component.values())
    listed = json.loads(cli("ls", "--models", "--store", str(store), "--json", check=True).stdout)
    assert [m["download_bytes"] for m in listed if m["name"] == model.name] == [model.download_bytes]
