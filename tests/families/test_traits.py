"""Families are handled by their traits (enginefarm.families.traits), never by their ids: no product module compares
a family id (an AST scan), and a made-up family with Flux's traits under another id takes Flux's paths in the
scheduler set-up, the transformer's inputs, the exporter and the LoRA check; with its built engines, the whole
pipeline gives Flux's latent to the bit."""

from __future__ import annotations

import ast
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from enginefarm.families import FAMILIES
from enginefarm.families.traits import Traits

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = (
    "backends",
    "builder",
    "diffusion",
    "enginefarm",
    "export",
    "families",
    "filters",
    "formats",
    "runner",
    "weights",
)


def _id_tests(source: str, where: str) -> list[str]:
    """Each comparison against a family id written as a string (`x == "sd1"`, `f.id in ("flux", "chroma")`) and each
    call of an id predicate (`is_flux_like(...)`), as "where:line"."""
    ids = set(FAMILIES)

    def names_an_id(node: ast.expr) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in ids
        return isinstance(node, ast.Tuple | ast.List | ast.Set) and any(names_an_id(e) for e in node.elts)

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(names_an_id(e) for e in (node.left, *node.comparators)):
            found.append(f"{where}:{node.lineno}")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "is_flux_like":
            found.append(f"{where}:{node.lineno}")
    return found


def test_no_product_module_compares_family_ids():
    found = [
        hit
        for folder in PRODUCT
        for path in sorted((ROOT / folder).rglob("*.py"))
        for hit in _id_tests(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == [], "read a trait (enginefarm.families.traits) instead of testing the family id"


def test_the_scan_finds_id_tests():
    code = 'if family.id in ("flux", "chroma"):\n    pass\nok = found == "sd2" or is_flux_like(f) or kind == "unet"\n'
    assert _id_tests(code, "x") == ["x:1", "x:3", "x:3"]


# A family no code knows by name, with Flux dev's traits and contracts.
MADE_UP = replace(FAMILIES["flux"], id="made-up", title="Made-up")


def test_a_made_up_family_with_flux_traits_gets_flux_schedule_and_inputs():
    from enginefarm.diffusion import make_scheduler, transformer_step
    from enginefarm.diffusion.prompts import TextConditioning

    config = {
        "_class_name": "FlowMatchEulerDiscreteScheduler",
        "use_dynamic_shifting": True,
        "base_shift": 0.5,
        "max_shift": 1.15,
        "shift": 3.0,
    }
    shape = (1, 16, 8, 12)
    schedules = {}
    # each with its transformer config's patch size: Flux's 1 (packed 2x2), SD3's 2 (unpacked): the same token grid
    for family, patch_size in ((FAMILIES["flux"], 1), (MADE_UP, 1), (FAMILIES["sd3"], 2)):
        sched = make_scheduler(None, config)
        patch = family.traits.patch_size({"patch_size": patch_size})
        tokens = (shape[-2] // patch) * (shape[-1] // patch)
        sched.set_timesteps_for_image(4, image_seq_len=tokens, spacing=family.traits.sigma_spacing)
        schedules[family.id] = sched.sigmas
    assert np.array_equal(schedules["made-up"], schedules["flux"])
    assert not np.allclose(schedules["sd3"], schedules["flux"])  # the traits decide: SD3's differ
    text = TextConditioning(np.zeros((1, 4, 4096), np.float32), np.zeros((1, 768), np.float32), None)
    feeds = transformer_step.feeds(MADE_UP, np.zeros(shape, np.float32), 500.0, text, 3.5)
    assert list(feeds) == ["hidden_states", "timestep", "encoder_hidden_states", "pooled_projections", "guidance"]
    assert feeds["guidance"].tolist() == [3.5]


def test_traits_set_the_patch_grid_and_the_lora_check():
    from enginefarm.weights.denoisers import families_of

    assert MADE_UP.traits.patch_size({"patch_size": 1}) == 2 == FAMILIES["sd3"].traits.patch_size({"patch_size": 2})
    assert Traits().patch_size(None) == 1 and not MADE_UP.true_cfg and FAMILIES["chroma"].true_cfg
    assert families_of("Flux") == ("flux", "flux-schnell", "chroma")  # from the traits, in the table's order
    assert "sd1-inpaint" in families_of("UNet (SD 1.x/2.x/SDXL)") and "sd3" not in families_of("Flux")


def test_the_exporter_packs_the_made_up_familys_transformer():
    pytest.importorskip("torch")
    from diffusers import FluxTransformer2DModel

    from enginefarm.export.components import wrap
    from enginefarm.export.wrappers import PackedTransformer, Transformer

    model = FluxTransformer2DModel(
        in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=True, axes_dims_rope=(2, 2, 4),
    )  # fmt: skip
    component = MADE_UP.component("transformer")
    assert isinstance(wrap(MADE_UP, component, model), PackedTransformer)
    unpacked = replace(MADE_UP, traits=replace(MADE_UP.traits, latent_packing=1))
    assert isinstance(wrap(unpacked, component, model), Transformer)


@pytest.mark.slow
def test_a_made_up_family_with_flux_traits_runs_the_flux_pipeline_to_the_bit(built, monkeypatch, tmp_path):
    """The tiny Flux dev engines loaded as the made-up family (its assets' family.json names it): the same latent as
    loaded as Flux, to the bit; the same family with SD3's sigma spacing gives another (the trait is read)."""
    from enginefarm.diffusion import Pipeline
    from tests.diffusion.test_pipeline_matches_diffusers import _model_name

    source, out, store = built("flux")
    assets = tmp_path / "assets"
    shutil.copytree(out / "assets", assets)
    described = json.loads((assets / "family.json").read_text())
    (assets / "family.json").write_text(json.dumps({**described, "family": "made-up"}))
    latents = np.random.default_rng(0).standard_normal((1, 16, 8, 8)).astype(np.float32)

    def run(folder: Path, family=MADE_UP) -> tuple[str, np.ndarray]:
        monkeypatch.setitem(FAMILIES, "made-up", family)
        pipe = Pipeline.load(
            _model_name(out), store=str(store), precision="fp32", target="onnxruntime:cpu", device="cpu", assets=folder
        )
        return pipe.family.id, pipe("a fox", steps=3, latents=latents, height=64, width=64, output_type="latent")

    flux, made_up = run(out / "assets"), run(assets)
    assert (flux[0], made_up[0]) == ("flux", "made-up") and np.array_equal(made_up[1], flux[1])
    other = replace(MADE_UP, traits=replace(MADE_UP.traits, sigma_spacing="scheduler"))
    assert not np.allclose(run(assets, other)[1], flux[1], atol=1e-4)
