"""Each kind of component as a torch module with the ONNX contract's signature: the diffusers or transformers
model loaded from its folder (fp32), wrapped so that its inputs and outputs are exactly the family table's, in
its order. torch, diffusers and transformers are imported inside the functions (the `export` extra)."""

from __future__ import annotations

import logging
from pathlib import Path

from enginefarm.families import ADDED_EMBEDS, Component

from .config_size import model_class
from .source import ExportSource

log = logging.getLogger(__name__)


# Transformers whose export packs latents into 2x2 patches inside the graph (export/flux.py).
PACKED_TRANSFORMERS = ("FluxTransformer2DModel", "ChromaTransformer2DModel")


class Loaded:
    """The torch models of one export, each loaded once (the VAE serves the decoder and the encoder, the UNet the
    plain and the ControlNet UNet) and dropped when its last component is done."""

    def __init__(self, source: ExportSource, components: tuple[str, ...]) -> None:
        self.source = source
        self.models: dict[str, object] = {}
        self.users: dict[str, int] = {}
        for name in components:
            folder = source.family.component(name).folder
            self.users[folder] = self.users.get(folder, 0) + 1

    def get(self, folder: str):
        if folder not in self.models:
            self.models[folder] = _load(self.source, folder)
        return self.models[folder]

    def done(self, folder: str) -> None:
        self.users[folder] -= 1
        if self.users[folder] == 0:
            self.models.pop(folder, None)


def _load(source: ExportSource, folder: str):
    """A component's model, fp32, from its local folder; nothing is fetched from a hub."""
    import torch

    # The pipeline's model_index.json names each folder's class (SD3Transformer2DModel, FluxTransformer2DModel…),
    # checked to be a model class of its library (export/config_size.py)
    cls = model_class(source, folder)
    return cls.from_pretrained(source.folder(folder), torch_dtype=torch.float32, local_files_only=True).eval()


def wrap(component: Component, model, family_time_ids: int):
    """`model` as a module whose forward takes the component's inputs positionally and returns its outputs."""
    import torch

    kind = component.kind
    output_names = [t.name for t in component.outputs]

    class TextEncoder(torch.nn.Module):
        """Each output by its name: `last_hidden_state` (SD 1.x/2.x's CLIP, T5), `hidden_states` (the penultimate
        layer: SDXL, SD3), `text_embeds` (CLIPTextModelWithProjection's pooled projection), `pooler_output`
        (CLIPTextModel's pooled state: Flux).

        The CLIP encoders take `added_embeds`: ids past the token table (textual-inversion tokens the pipeline added)
        take their row from it; the table's lookup sees them clamped, and its result is replaced at those positions.
        The model itself still sees the ids, so the pooled output picks its token as transformers does with a grown
        table. Chroma's T5 takes the tokenizer's `attention_mask` instead; the other T5s read ids alone. The UNet
        families' CLIPs take an `attention_mask` too (compel's down-weighting) and give `layer_states`, every layer's
        states stacked for clip_skip: through the final layer norm where the pipeline's own output is (SD 1.x/2.x's
        last_hidden_state), raw where it is not (SDXL's penultimate hidden_states)."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.extra_inputs = [t.name for t in component.inputs[1:]]
            self.second = ADDED_EMBEDS if ADDED_EMBEDS in self.extra_inputs else None
            self.norm = None
            if "layer_states" in output_names and "last_hidden_state" in output_names:
                self.norm = getattr(model, "final_layer_norm", None) or model.text_model.final_layer_norm
            # The ids and added rows of the forward under way: set by forward before the table's hooks run.
            self._ids: torch.Tensor | None = None
            self._added: torch.Tensor | None = None
            if self.second == ADDED_EMBEDS:
                table = model.get_input_embeddings()
                self.rows = table.num_embeddings
                table.register_forward_pre_hook(lambda _, args: (args[0].clamp(0, self.rows - 1), *args[1:]))
                table.register_forward_hook(lambda _, args, out: self._with_added(out))

        def _with_added(self, out):
            """The table's lookup with the added rows at the ids past the table."""
            ids, added = self._ids, self._added
            assert ids is not None and added is not None  # forward sets both before the table runs
            return torch.where((ids >= self.rows).unsqueeze(-1), added.to(out.dtype), out)

        def forward(self, input_ids, *rest):
            given = dict(zip(self.extra_inputs, rest, strict=True))
            extra = {}
            if ADDED_EMBEDS in given:
                self._ids, self._added = input_ids, given[ADDED_EMBEDS]
            if "attention_mask" in given:
                extra["attention_mask"] = given["attention_mask"]
            layers = "hidden_states" in output_names or "layer_states" in output_names
            out = self.model(input_ids=input_ids, output_hidden_states=layers, **extra)
            results = [self._output(out, name) for name in output_names]
            return tuple(results) if len(results) > 1 else results[0]

        def _output(self, out, name: str):
            if name == "hidden_states":
                return out.hidden_states[-2]
            if name == "layer_states":
                states = [self.norm(h) if self.norm is not None else h for h in out.hidden_states]
                return torch.stack(states, dim=1)
            return getattr(out, name)

    class Transformer(torch.nn.Module):
        """A diffusion transformer (SD3's MMDiT, Flux, Chroma): the family table names its inputs as the model's
        forward names its arguments, so they are passed by name; the first output is the prediction."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.names = [t.name for t in component.inputs]

        def forward(self, *args):
            return self.model(**dict(zip(self.names, args, strict=True)), return_dict=False)[0]

    class Denoiser(torch.nn.Module):
        """The UNet (plain, or taking ControlNet residuals) and the ControlNet itself. SDXL's added conditioning
        (text_embeds, time_ids) comes after the common inputs, the residuals last."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, sample, timestep, encoder_hidden_states, *rest):
            rest = list(rest)
            cond = rest.pop(0) if kind == "controlnet" else None
            added = None
            if family_time_ids:
                added = {"text_embeds": rest.pop(0), "time_ids": rest.pop(0)}
            if kind == "controlnet":
                down, mid = self.model(
                    sample,
                    timestep,
                    encoder_hidden_states,
                    controlnet_cond=cond,
                    conditioning_scale=1.0,
                    added_cond_kwargs=added,
                    return_dict=False,
                )
                return (*down, mid)
            if kind == "unet_controlnet":
                return self.model(
                    sample,
                    timestep,
                    encoder_hidden_states,
                    added_cond_kwargs=added,
                    down_block_additional_residuals=tuple(rest[:-1]),
                    mid_block_additional_residual=rest[-1],
                    return_dict=False,
                )[0]
            return self.model(sample, timestep, encoder_hidden_states, added_cond_kwargs=added, return_dict=False)[0]

    class VaeDecoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, latent_sample):
            return self.model.decode(latent_sample, return_dict=False)[0]

    class VaeEncoder(torch.nn.Module):
        """The latent distribution's parameters (mean and log-variance on the channel axis), not a sample: the
        pipeline takes the mean or samples with its own seeded noise."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, sample):
            return self.model.encode(sample, return_dict=False)[0].parameters

    if kind == "transformer" and type(model).__name__ in PACKED_TRANSFORMERS:
        from .flux import chroma_module, flux_module

        if type(model).__name__ == "ChromaTransformer2DModel":
            return chroma_module(model)
        return flux_module(model, guidance=any(t.name == "guidance" for t in component.inputs))
    wrapper: type[torch.nn.Module] = {
        "text_encoder": TextEncoder,
        "transformer": Transformer,
        "unet": Denoiser,
        "unet_controlnet": Denoiser,
        "controlnet": Denoiser,
        "vae_decoder": VaeDecoder,
        "vae_encoder": VaeEncoder,
    }[kind]
    return wrapper().eval()


# The checkpoint of each component: its model's state_dict in diffusers/transformers names. The VAE's halves take
# their own keys; the ControlNet UNet shares the UNet's file.
_CHECKPOINT_PREFIXES = {"vae_decoder": ("decoder.", "post_quant_conv."), "vae_encoder": ("encoder.", "quant_conv.")}
SHARED_CHECKPOINTS = {"unet_controlnet": "unet"}


def checkpoint_tensors(component: Component, model) -> dict:
    prefixes = _CHECKPOINT_PREFIXES.get(component.kind)
    state = model.state_dict()
    tensors, seen = {}, set()
    for key, value in state.items():
        if prefixes is None or key.startswith(prefixes):
            value = value.detach().contiguous()
            # Tied weights (T5's shared embedding and encoder.embed_tokens) are one storage; safetensors wants each
            # name to own its bytes, and every name stays, as the state_dict has it.
            if value.data_ptr() in seen:
                value = value.clone()
            seen.add(value.data_ptr())
            tensors[key] = value
    return tensors


def write_checkpoint(component: Component, model, path: Path) -> Path:
    from safetensors.torch import save_file

    save_file(checkpoint_tensors(component, model), str(path), metadata={"format": "pt"})
    return path
