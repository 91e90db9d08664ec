"""`Pipeline.load(memory_budget=...)`: components load when a stage needs them and are closed when the next would not
fit; the image is the same as without a budget."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest

from enginefarm.errors import ConfigError, SessionClosed

pytest.importorskip("diffusers")


def _load(built, **kwargs):
    from enginefarm.diffusion import Pipeline

    _, out, store = built("sd1")
    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    return Pipeline.load(
        name,
        store=str(store),
        precision="fp32",
        target="onnxruntime:cpu",
        device="cpu",
        assets=out / "assets",
        **kwargs,
    )


def test_a_budget_loads_stage_by_stage_and_changes_nothing_in_the_image(built):
    with _load(built) as everything:
        assert set(everything.sessions) == {"text_encoder", "unet", "vae_decoder"}
        reference = everything("a lighthouse", steps=2, seed=3)
    with _load(built, memory_budget=1) as tight:  # nothing fits beside anything: one stage's components at a time
        assert tight.sessions == {}
        first = tight("a lighthouse", steps=2, seed=3)
        assert set(tight.sessions) == {"vae_decoder"}  # the text encoder and the UNet were closed on the way
        second = tight("a lighthouse", steps=2, seed=3)
        assert tight.residency.loads == 6  # three components, each loaded again for the second image
    assert np.array_equal(first, reference) and np.array_equal(second, reference)
    with _load(built, memory_budget="64G") as roomy:  # everything fits: loaded once, kept
        roomy("a lighthouse", steps=2, seed=3)
        roomy("a lighthouse", steps=2, seed=3)
        assert roomy.residency.loads == 3 and set(roomy.sessions) == {"text_encoder", "unet", "vae_decoder"}
        # measured here, per component (a tiny model may load into memory an earlier pipeline freed: 0 is a measure)
        held = roomy.residency.held
        assert set(held) == {"text_encoder", "unet", "vae_decoder"} and all(v >= 0 for v in held.values())


def test_a_closed_pipeline_refuses_and_bad_budgets_are_one_line_errors(built):
    pipe = _load(built, memory_budget="auto")
    with pytest.raises(
        ConfigError, match="max_sequence_length is for the T5 encoders"
    ) as caught:  # SD 1.x reads CLIP's 77 tokens
        pipe("a lighthouse", steps=1, max_sequence_length=256)
    assert caught.value.hint and not pipe.sessions  # refused before anything loaded
    pipe.close()
    pipe.close()
    with pytest.raises(SessionClosed, match="closed"):
        pipe("a lighthouse", steps=1)
    for bad in (0, -5, "lots", True):
        with pytest.raises(ConfigError, match="memory_budget"):
            _load(built, memory_budget=bad)


class _Model:
    """A component whose memory arrives when it first runs, as OpenVINO's does (the real SD 1.5 UNet: 0.3 GB once
    loaded, 6.7 GB after one step): real pages, written so they are resident."""

    def __init__(self) -> None:
        self.memory = None

    def run(self, megabytes: int) -> None:
        self.memory = np.ones(megabytes << 18, np.float32)  # 4 bytes each

    def close(self) -> None:
        self.memory = None


def test_what_a_component_grew_by_while_it_ran_counts_against_the_budget():
    from enginefarm.diffusion.budget import Residency

    sessions: dict = {}
    residency = Residency(300 << 20, lambda component: _Model(), sessions, lambda component: 50 << 20)
    residency.need(["unet"])
    sessions["unet"].run(400)  # its first step
    residency.need(["vae_decoder"])  # 400 MB held + 50 MB wanted > 300 MB: the UNet goes
    assert set(sessions) == {"vae_decoder"}, residency.held
    assert residency.ran["unet"] >= 350 << 20, residency.ran
    residency.need(["unet"])  # loaded again: known now to need 400 MB, which does not fit beside the decoder
    assert set(sessions) == {"unet"} and residency.loads == 3
