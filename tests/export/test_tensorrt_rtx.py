"""An exported family built for TensorRT-RTX by the real SDK (no GPU needed to build): the tiny SD 1.x UNet at fp16
for ampere+, published unvalidated with golden samples that the first GPU to load it checks (runner/golden_check.py)."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from tests.conftest import run_cli
from tests.nvidia_fakes import require_real_rtx


@pytest.mark.slow
def test_the_sd1_unet_builds_for_tensorrt_rtx_with_golden_samples(tiny, exported, tmp_path):
    require_real_rtx()
    # The session's sd1 export (linked, not exported again) with its recipe's defaults as `export --targets
    # tensorrt-rtx:ampere+ --precisions fp16` writes them: the two options reach nothing of an export but those lines.
    folder = shutil.copytree(exported(tiny("sd1")).out, tmp_path / "sd1-rtx", copy_function=os.link)
    recipe = folder / "recipe.toml"
    text = re.sub(r"(?m)^targets = .*$", 'targets = ["tensorrt-rtx:ampere+"]', recipe.read_text(), count=1)
    recipe.unlink()  # a link to the shared export's: replaced, never written through
    recipe.write_text(re.sub(r"(?m)^precisions = .*$", 'precisions = ["fp16"]', text, count=1))
    store = tmp_path / "rtx-store"
    proc = run_cli("build", str(recipe), "--store", str(store), "--component", "unet", "--no-bench", check=True)
    assert "1 built, 0 failed" in proc.stdout, proc.stdout
    manifest = next(
        json.loads(p.read_text())
        for p in (store / "manifests").glob("*.json")
        if '"component": "unet"' in p.read_text()
    )
    assert manifest["target"] == "tensorrt-rtx:ampere+" and manifest["precision"] == "fp16"
    roles = {f["role"] for f in manifest["files"]}
    assert {"engine", "golden"} <= roles, roles
    assert manifest["validation"].get("executed") is False  # no GPU here: the first device checks the golden samples
    names = {t["name"] for t in manifest["io"]["inputs"]}
    assert names == {"sample", "timestep", "encoder_hidden_states"}
