"""Preview decoders at run time: a tiny seeded TAESD (diffusers AutoencoderTiny folder) exported and built for ONNX
Runtime and OpenVINO at fp32 and fp16 decodes as a diffusers pipeline with it as its VAE; `Pipeline.load(preview=)`
feeds on_preview with its images and `decoder=` makes the final image with it (against diffusers' StableDiffusion
pipeline with `vae = AutoencoderTiny`); a decoder of another latent space is one line before anything loads."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.errors import ConfigError
from enginefarm.filters import FilterInfo
from enginefarm.filters.preview import PreviewDecoder

from .scenes import scene
from .tiny_filters import taesd_encode_reference, taesd_reference, write_taesd_folder

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

TARGETS = ("onnxruntime:cpu", "openvino:cpu")


@pytest.fixture(scope="module")
def built_taesd(tmp_path_factory):
    """The tiny TAESD (its folder named as madebyollin's SD 1.x decoder) exported and built: (model, store)."""
    from diffusers import AutoencoderTiny

    from enginefarm.export.filters.run import export_filter

    from ..conftest import run_cli

    root = tmp_path_factory.mktemp("taesd")
    write_taesd_folder(root / "taesd")
    # latent sides 8 to 32 (the tests' latents), images 64 to 256: validation and the builder's memory rule stay at
    # test size
    small = {"latent_height": (8, 16, 32), "latent_width": (8, 16, 32)}
    small |= {"image_height": (64, 128, 256), "image_width": (64, 128, 256)}
    export = export_filter(root / "taesd", root / "out", name="tiny-taesd", targets=TARGETS, profile=small)
    run_cli("build", str(export.recipe), "--store", str(root / "store"), "--no-bench", "-j", "2", check=True)
    return AutoencoderTiny.from_pretrained(root / "taesd").eval(), root / "store"


def _load(built_taesd, target="onnxruntime:cpu", precision="fp32") -> PreviewDecoder:
    import enginefarm.filters

    found = enginefarm.filters.load("tiny-taesd", store=str(built_taesd[1]), precision=precision, target=target)
    assert isinstance(found, PreviewDecoder)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision, tolerance", [("fp32", 1e-3), ("fp16", 2e-2)])
def test_the_built_decoder_and_encoder_match_diffusers(built_taesd, target, precision, tolerance):
    model, _ = built_taesd
    latents = np.random.default_rng(3).standard_normal((2, 4, 12, 10)).astype(np.float32) * 1.5
    want = taesd_reference(model, latents)
    with _load(built_taesd, target, precision) as decoder:
        assert (decoder.latent_channels, decoder.upscale, decoder.latent_scaling_factor) == (4, 8, 0.18215)
        got = decoder.decode(latents)
        assert got.shape == (2, 96, 80, 3) and got.dtype == np.float32
        assert np.abs(got - want).max() < tolerance
        assert np.array_equal(decoder(latents[1]), got[1])  # one latent [C, h, w]: one image
        assert np.ptp(want) > 0.3  # the images vary: the comparison sees real values
        with pytest.raises(ConfigError, match=r"takes latents \[N, 4, h, w\]"):
            decoder(np.zeros((1, 16, 8, 8), np.float32))
        # the folder's encoder: the model-space latent diffusers' img2img makes with this VAE
        images = np.stack([scene(7, 96, 136), scene(8, 96, 136)])
        want_latents = taesd_encode_reference(model, images)
        assert decoder.has_encoder
        encoded = decoder.encode(images)
        assert encoded.shape == (2, 4, 12, 17) and encoded.dtype == np.float32
        assert np.abs(encoded - want_latents).max() < tolerance * np.ptp(want_latents)
        assert np.array_equal(decoder.encode(images[0]), encoded[:1])
        with pytest.raises(ConfigError, match="sides multiples of 8"):
            decoder.encode(images[:, :90])


def _fake_taesd(channels: int, space: float | None) -> PreviewDecoder:
    """A decoder's description alone (no engine): what the pipeline checks before anything loads."""
    details = {"latent_channels": channels, "upscale": 8, "latent_scaling_factor": space}
    return PreviewDecoder(FilterInfo("taesd-x", "preview_decoder", "AutoencoderTiny", ("decoder",), details), {})


def test_a_decoder_without_its_encoder_says_so():
    with pytest.raises(ConfigError, match="has no encoder"):
        _fake_taesd(4, None).encode(np.zeros((64, 64, 3), np.float32))


def test_a_decoder_of_another_latent_space_is_one_line():
    _fake_taesd(4, 0.18215).check_fits(4, 0.18215, "SD 1.5")
    _fake_taesd(4, None).check_fits(4, 0.13025, "SDXL")  # a name that does not say: channels only
    with pytest.raises(ConfigError, match="decodes 16-channel latents; SD 1.5 has 4-channel latents"):
        _fake_taesd(16, 1.5305).check_fits(4, 0.18215, "SD 1.5")
    with pytest.raises(ConfigError, match="another latent space"):
        _fake_taesd(4, 0.18215).check_fits(4, 0.13025, "SDXL")


@pytest.mark.slow
def test_the_pipeline_previews_and_decodes_with_taesd(built, built_taesd, tmp_path):
    from enginefarm.diffusion import Pipeline
    from enginefarm.diffusion.assets import ModelAssets
    from enginefarm.diffusion.loading import preview_filters

    from ..diffusion.test_pipeline_matches_diffusers import PROMPT, STEPS, _latents, _model_name

    source, out, store = built("sd1")
    model, taesd_store = built_taesd
    options = dict(store=str(store), precision="fp32", target="onnxruntime:cpu", device="cpu", assets=out / "assets")
    with pytest.raises(ConfigError, match="16-channel latents"):
        Pipeline.load(_model_name(out), preview=_fake_taesd(16, 1.5305), **options)
    taesd = _load(built_taesd)
    pipe = Pipeline.load(_model_name(out), preview=taesd, decoder=taesd, **options)
    assert "vae_decoder" not in pipe.sessions  # decoder= replaces the VAE
    seen: list[tuple[int, np.ndarray]] = []
    latents = _latents(pipe)
    kwargs = dict(steps=STEPS, scheduler="euler", latents=latents, guidance_scale=6.0)
    image = pipe(PROMPT, on_preview=lambda step, preview: seen.append((step, preview)), **kwargs)
    final = pipe(PROMPT, output_type="latent", **kwargs)
    side = pipe.assets.native_pixels
    assert [step for step, _ in seen] == list(range(1, STEPS + 1))
    assert all(preview.shape == (side, side, 3) for _, preview in seen)  # full size, not the latent's
    # Euler's last step lands on its predicted clean latent: the last preview is TAESD's image of the final latent
    assert np.abs(seen[-1][1] - taesd_reference(model, final)[0]).max() < 1e-3
    assert not np.allclose(seen[0][1], seen[-1][1])
    assert image.shape == (side, side, 3) and np.array_equal(image, seen[-1][1])
    # diffusers' pipeline with the AutoencoderTiny as its VAE gives the same image
    theirs = diffusers.StableDiffusionPipeline.from_pretrained(source, vae=model, safety_checker=None)
    theirs.set_progress_bar_config(disable=True)
    theirs.scheduler = diffusers.EulerDiscreteScheduler.from_config(theirs.scheduler.config)
    reference = theirs(
        PROMPT, num_inference_steps=STEPS, latents=torch.from_numpy(latents), guidance_scale=6.0, output_type="np"
    ).images[0]
    assert np.abs(image - reference).max() < 1e-3
    pipe.close()
    assert taesd.sessions  # a filter the caller loaded stays open
    taesd.close()
    # by name: loaded from the store (the pipeline's, in Pipeline.load) once for both roles, and owned
    assets = ModelAssets.from_folder(out / "assets")
    found, owned = preview_filters(
        assets, "tiny-taesd", "tiny-taesd", store=str(taesd_store), target="onnxruntime:cpu", device="cpu"
    )
    assert found["preview"] is found["decoder"] and owned == [found["preview"]]
    owned[0].close()


def _link_tree(source, into) -> None:
    """Hard links of a store's files into another (blobs are content-addressed: a shared one is the same bytes)."""
    import os

    for path in source.rglob("*"):
        if path.is_file():
            target = into / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                os.link(path, target)


def test_generate_writes_taesd_previews_and_decodes_with_it(built, built_taesd, tmp_path):
    from enginefarm.diffusion import read_png
    from enginefarm.diffusion.metadata import read_parameters

    from ..conftest import run_cli
    from ..diffusion.test_pipeline_matches_diffusers import _model_name

    _, out, store = built("sd1")
    merged = tmp_path / "store"
    _link_tree(store, merged)
    _link_tree(built_taesd[1], merged)
    name, previews = _model_name(out), tmp_path / "previews"
    common = (name, "a fox", "--store", str(merged), "--steps", "2", "--scheduler", "euler")
    common += ("--target", "onnxruntime:cpu")
    png = tmp_path / "fox.png"
    run_cli("generate", *common, "--preview", "tiny-taesd", "--preview-dir", str(previews), "--decoder", "tiny-taesd",
            "--precision", "fp32", "--out", str(png), check=True)  # fmt: skip
    image = read_png(png)
    shown = sorted(previews.glob("step-*.png"))
    assert [p.name for p in shown] == ["step-001.png", "step-002.png"]
    assert read_png(shown[-1]).shape == image.shape  # TAESD's preview is full size: written as is
    assert np.abs(read_png(shown[-1]) - image).max() <= 1 / 255  # Euler's last preview is the image it decodes
    assert read_parameters(png)["decoder"] == "tiny-taesd"
    no_dir = run_cli("generate", *common, "--preview", "tiny-taesd", "--out", str(tmp_path / "x.png"))
    assert no_dir.returncode != 0 and "give --preview-dir DIR too" in no_dir.stderr and "Traceback" not in no_dir.stderr
    wrong = run_cli("generate", *common, "--decoder", name, "--out", str(tmp_path / "y.png"))
    assert wrong.returncode != 0 and "not a filter" in wrong.stderr, wrong.stderr
