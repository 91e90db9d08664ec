"""The tests' own torch reference for each exported component, written from diffusers' and transformers' public
APIs (not the exporter's wrappers), and seeded feeds for any ONNX model's inputs at a chosen shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def feeds_for(session, batch: int, height: int, width: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for an onnxruntime session at a latent batch×height×width (pixel dims 8x): token ids in the tiny
    vocabulary, fractional timesteps, unit noise elsewhere, images in [0, 1] for the ControlNet's condition."""
    rng = np.random.default_rng(seed)
    dims = {
        "batch": batch,
        "height": height,
        "width": width,
        "image_height": 8 * height,
        "image_width": 8 * width,
        "prompt_tokens": 77,
    }
    feeds = {}
    for arg in session.get_inputs():
        shape = [
            d if isinstance(d, int) else dims.get(d) or dims[d.split("_div")[0]] // int(d.split("_div")[1])
            for d in arg.shape
        ]
        if arg.name == "input_ids":
            feeds[arg.name] = rng.integers(0, 1000, size=shape).astype(np.int64)
        elif arg.name == "attention_mask":  # every token attended, as the pipelines feed it by default
            feeds[arg.name] = np.ones(shape, np.int64)
        elif arg.name == "timestep":
            feeds[arg.name] = rng.uniform(0, 999, size=shape).astype(np.float32)
        elif arg.name == "controlnet_cond":
            feeds[arg.name] = rng.uniform(0, 1, size=shape).astype(np.float32)
        elif arg.name == "time_ids":
            feeds[arg.name] = rng.uniform(0, 128, size=shape).astype(np.float32)
        else:
            feeds[arg.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def torch_reference(
    pipeline: Path, component: str, feeds: dict[str, np.ndarray], controlnet: Path | None = None
) -> dict[str, np.ndarray]:
    """What diffusers computes for `component` of the pipeline folder on `feeds`, by output name."""
    import torch
    from diffusers import ControlNetModel, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    t = {k: torch.from_numpy(v) for k, v in feeds.items()}
    added = {"text_embeds": t["text_embeds"], "time_ids": t["time_ids"]} if "time_ids" in t else None
    with torch.no_grad():
        if component.startswith("text_encoder"):
            projected = (pipeline / component / "config.json").read_text().count("CLIPTextModelWithProjection") > 0
            model = (
                (CLIPTextModelWithProjection if projected else CLIPTextModel)
                .from_pretrained(pipeline / component)
                .eval()
            )
            out = model(t["input_ids"], output_hidden_states=True)
            result = {"last_hidden_state": out.last_hidden_state, "hidden_states": out.hidden_states[-2]}
            # clip_skip's states: every layer's, through the final layer norm for SD 1.x/2.x, raw for SDXL
            index = (pipeline / "model_index.json").read_text()
            norm = (lambda h: h) if "XL" in index else model.final_layer_norm
            result["layer_states"] = torch.stack([norm(h) for h in out.hidden_states], dim=1)
            if projected:
                result["text_embeds"] = out.text_embeds
        elif component in ("unet", "unet_controlnet"):
            unet = UNet2DConditionModel.from_pretrained(pipeline / "unet").eval()
            residuals = {}
            if component == "unet_controlnet":
                down = [
                    t[k]
                    for k in sorted(
                        (k for k in t if k.startswith("down_block_")), key=lambda k: int(k.rsplit("_", 1)[1])
                    )
                ]
                residuals = {
                    "down_block_additional_residuals": down,
                    "mid_block_additional_residual": t["mid_block_additional_residual"],
                }
            result = {
                "out_sample": unet(
                    t["sample"], t["timestep"], t["encoder_hidden_states"], added_cond_kwargs=added, **residuals
                ).sample
            }
        elif component == "controlnet":
            model = ControlNetModel.from_pretrained(controlnet or pipeline / "controlnet").eval()
            out = model(
                t["sample"],
                t["timestep"],
                t["encoder_hidden_states"],
                controlnet_cond=t["controlnet_cond"],
                added_cond_kwargs=added,
            )
            result = {f"down_block_res_sample_{i}": r for i, r in enumerate(out.down_block_res_samples)}
            result["mid_block_res_sample"] = out.mid_block_res_sample
        else:
            result = vae_reference(pipeline, component, t)
    return {k: v.numpy() for k, v in result.items()}


def vae_reference(pipeline, component: str, t: dict) -> dict:
    """diffusers' VAE on the component's inputs (torch tensors): the decoder's image, or the encoder's mean and
    log-variance on the channel axis."""
    import torch
    from diffusers import AutoencoderKL

    vae = AutoencoderKL.from_pretrained(pipeline / "vae").eval()
    if component == "vae_decoder":
        return {"sample": vae.decode(t["latent_sample"]).sample}
    dist = vae.encode(t["sample"]).latent_dist
    return {"latent_parameters": torch.cat([dist.mean, dist.logvar], dim=1)}


def deviation(want: np.ndarray, have: np.ndarray) -> float:
    """max |difference| over the reference's range."""
    return float(np.max(np.abs(want.astype(np.float64) - have)) / (np.ptp(want) or 1.0))
