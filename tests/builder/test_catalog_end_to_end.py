"""A catalog recipe end to end without the Hub: a local Hub on loopback serves a real-layout (original LDM names),
narrow, seeded SD 1.x single-file checkpoint and its tokenizer, under a catalog recipe whose pins are the served
files'; `enginefarm build` downloads, verifies, exports over the shipped SD 1.5 configs (the narrow widths from the
recipe's own config files) and builds with CI=true, and `enginefarm generate` draws from the store."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest

from tests.builder.test_catalog import _Server
from tests.weights.originals import original_tensors, write_file

REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.slow
def test_a_pinned_single_file_downloads_exports_builds_and_generates(tiny, tmp_path, cli):
    from enginefarm.diffusion import read_png
    from enginefarm.formats.safetensors_io import SafeTensors

    source = tiny("sd1")
    checkpoint = write_file(tmp_path / "v1-5-narrow.safetensors", original_tensors(source, "sd1"))
    hub = _Server()
    served = {"checkpoint": checkpoint}
    for folder in ("tokenizer", "unet", "vae", "text_encoder"):  # narrow configs replace the shipped full-size ones
        for path in (source / folder).iterdir():
            if path.suffix in (".json", ".txt"):
                served[f"{folder}/{path.name}"] = path
    lines = []
    for key, path in served.items():
        data = path.read_bytes()
        hub.files[f"/org/sd/resolve/{REV}/{path.name if key == 'checkpoint' else key}"] = data
        pin = f'source = "hf://org/sd/{path.name if key == "checkpoint" else key}@{REV}"\n'
        pin += f'sha256 = "{hashlib.sha256(data).hexdigest()}"\nsize = {len(data)}\n'
        lines.append(f"[export.{'checkpoint' if key == 'checkpoint' else f'files.{chr(34)}{key}{chr(34)}'}]\n{pin}")
    recipe = tmp_path / "sd-narrow.toml"
    recipe.write_text(
        '[model]\nname = "sd-narrow"\nversion = "1"\n\n[export]\nfamily = "sd1"\nconfigs = "sd-1.5"\n'
        'licence = "test"\ngated = false\nbatch = [1, 2, 2]\nlatent = [8, 8, 16]\n\n'
        + "\n".join(lines)
        + '\n[defaults]\ntargets = ["onnxruntime:cpu"]\nprecisions = ["fp32"]\n'
    )
    env = {"HF_ENDPOINT": hub.url, "ENGINEFARM_HOME": str(tmp_path / "home"), "CI": "true", "HF_HOME": str(tmp_path)}
    store = tmp_path / "store"
    try:
        txt2img = ("--component", "text_encoder", "--component", "unet", "--component", "vae_decoder")
        built = cli("build", str(recipe), "--store", str(store), "--no-bench", "-j", "2", *txt2img, env=env)
        assert built.returncode == 0, built.stdout + built.stderr
        assert "exported sd-narrow" in built.stdout and "0 failed" in built.stdout
        assert re.search(r"exported sd-narrow: download \d+ s, export \d+ s, peak \d+\.\d GB", built.stdout)
        (export,) = (tmp_path / "home" / "catalog").glob("sd-narrow-*")
        ours, theirs = (
            SafeTensors(export / "unet.safetensors"),
            SafeTensors(source / "unet" / "diffusion_pytorch_model.safetensors"),
        )
        assert set(ours.names) == set(theirs.names)
        for name in theirs.names:  # the served checkpoint's weights, through the original layout and back
            np.testing.assert_array_equal(ours.array(name), theirs.array(name), err_msg=name)
        out = tmp_path / "fox.png"
        made = cli(
            "generate", "sd-narrow", "a red fox", "--store", str(store), "--steps", "2", "--out", str(out), env=env
        )
        assert made.returncode == 0, made.stdout + made.stderr
        assert read_png(out).std() > 0.01
        # a publisher's file that changed: refused before anything reads it, nothing exported
        hub.files[f"/org/sd/resolve/{REV}/{checkpoint.name}"] = checkpoint.read_bytes()[:-8] + b"\x00" * 8
        changed = recipe.read_text().replace("sd-narrow", "sd-changed")
        (tmp_path / "changed.toml").write_text(changed)
        env["ENGINEFARM_HOME"] = str(tmp_path / "home2")
        refused = cli("build", str(tmp_path / "changed.toml"), "--store", str(store), env=env)
        assert (
            refused.returncode == 1 and "does not match its pin" in refused.stderr and "Traceback" not in refused.stderr
        )
        assert not (tmp_path / "home2" / "catalog").exists()
    finally:
        hub.http.shutdown()
