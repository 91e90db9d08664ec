"""One exporter per component kind: the diffusers or transformers model as a torch module whose forward takes the
component's inputs positionally (the family table's order) and returns its outputs. `export.components.wrap`
picks one from `EXPORTERS`; this module imports torch, so only the export imports it (the `export` extra)."""

from __future__ import annotations

import torch

from enginefarm.families import ADDED_EMBEDS, Component, Family

from .flux import pack, position_ids, unpack


class TextEncoder(torch.nn.Module):
    """Each output by its name: `last_hidden_state` (SD 1.x/2.x's CLIP, T5), `hidden_states` (the penultimate layer:
    SDXL, SD3), `text_embeds` (CLIPTextModelWithProjection's pooled projection), `pooler_output` (CLIPTextModel's
    pooled state: Flux).

    The CLIP encoders take `added_embeds`: ids past the token table (textual-inversion tokens the pipeline added) take
    their row from it; the table's lookup sees them clamped, and its result is replaced at those positions. The model
    itself still sees the ids, so the pooled output picks its token as transformers does with a grown table. Chroma's
    T5 takes the tokenizer's `attention_mask` instead; the other T5s read ids alone. The UNet families' CLIPs take an
    `attention_mask` too (compel's down-weighting) and give `layer_states`, every layer's states stacked for
    clip_skip: through the final layer norm where the pipeline's own output is (SD 1.x/2.x's last_hidden_state), raw
    where it is not (SDXL's penultimate hidden_states)."""

    def __init__(self, family: Family, component: Component, model) -> None:
        super().__init__()
        self.model = model
        self.output_names = [t.name for t in component.outputs]
        self.extra_inputs = [t.name for t in component.inputs[1:]]
        self.norm = None
        if "layer_states" in self.output_names and "last_hidden_state" in self.output_names:
            self.norm = getattr(model, "final_layer_norm", None) or model.text_model.final_layer_norm
        # The ids and added rows of the forward under way: set by forward before the table's hooks run.
        self._ids: torch.Tensor | None = None
        self._added: torch.Tensor | None = None
        if ADDED_EMBEDS in self.extra_inputs:
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
        layers = "hidden_states" in self.output_names or "layer_states" in self.output_names
        out = self.model(input_ids=input_ids, output_hidden_states=layers, **extra)
        results = [self._output(out, name) for name in self.output_names]
        return tuple(results) if len(results) > 1 else results[0]

    def _output(self, out, name: str):
        if name == "hidden_states":
            return out.hidden_states[-2]
        if name == "layer_states":
            states = [self.norm(h) if self.norm is not None else h for h in out.hidden_states]
            return torch.stack(states, dim=1)
        return getattr(out, name)


class Transformer(torch.nn.Module):
    """A diffusion transformer fed the latent as it is (SD3's MMDiT): the family table names its inputs as the
    model's forward names its arguments, so they are passed by name; the first output is the prediction."""

    def __init__(self, family: Family, component: Component, model) -> None:
        super().__init__()
        self.model = model
        self.names = [t.name for t in component.inputs]

    def forward(self, *args):
        return self.model(**dict(zip(self.names, args, strict=True)), return_dict=False)[0]


class _UNetBase(torch.nn.Module):
    """The UNet-shaped denoisers' common inputs (sample, timestep, text states); SDXL's added conditioning
    (text_embeds, time_ids) follows them where the family has time ids."""

    def __init__(self, family: Family, component: Component, model) -> None:
        super().__init__()
        self.model = model
        self.time_ids = family.time_ids

    def _added(self, rest: list):
        return {"text_embeds": rest.pop(0), "time_ids": rest.pop(0)} if self.time_ids else None


class UNet(_UNetBase):
    def forward(self, sample, timestep, encoder_hidden_states, *rest):
        added = self._added(list(rest))
        return self.model(sample, timestep, encoder_hidden_states, added_cond_kwargs=added, return_dict=False)[0]


class UNetWithResiduals(_UNetBase):
    """The UNet a ControlNet feeds: its down-block residuals, then its mid-block one, after the other inputs."""

    def forward(self, sample, timestep, encoder_hidden_states, *rest):
        rest = list(rest)
        added = self._added(rest)
        return self.model(
            sample,
            timestep,
            encoder_hidden_states,
            added_cond_kwargs=added,
            down_block_additional_residuals=tuple(rest[:-1]),
            mid_block_additional_residual=rest[-1],
            return_dict=False,
        )[0]


class ControlNet(_UNetBase):
    """The ControlNet: the control image after the common inputs; its residuals out, the down blocks' then the
    mid block's."""

    def forward(self, sample, timestep, encoder_hidden_states, *rest):
        rest = list(rest)
        cond = rest.pop(0)
        added = self._added(rest)
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


class VaeDecoder(torch.nn.Module):
    def __init__(self, family: Family, component: Component, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, latent_sample):
        return self.model.decode(latent_sample, return_dict=False)[0]


class VaeEncoder(torch.nn.Module):
    """The latent distribution's parameters (mean and log-variance on the channel axis), not a sample: the pipeline
    takes the mean or samples with its own seeded noise."""

    def __init__(self, family: Family, component: Component, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, sample):
        return self.model.encode(sample, return_dict=False)[0].parameters


class PackedTransformer(torch.nn.Module):
    """A transformer fed 2x2-patch tokens (Flux.1, Chroma: the family's `latent_packing`) with the contract of SD3's:
    unpacked latents in and out. The graph packs the latent, builds the position ids and unpacks the prediction
    (export/flux.py). `timestep` is the scheduler's (0…1000): Flux's pipelines divide it by 1000 and the model
    multiplies it back, which this does in the same order. The inputs after the text states go by name: Flux's
    `pooled_projections` and dev's `guidance`; Chroma's `attention_mask` over the text tokens, to which the image
    tokens are appended attended, as its pipeline does."""

    def __init__(self, family: Family, component: Component, model) -> None:
        super().__init__()
        self.model = model
        self.names = [t.name for t in component.inputs[3:]]

    def forward(self, hidden_states, timestep, encoder_hidden_states, *rest):
        given = dict(zip(self.names, rest, strict=True))
        image_ids, text_ids = position_ids(hidden_states, encoder_hidden_states)
        tokens = pack(hidden_states)
        if "attention_mask" in given:
            given["attention_mask"] = torch.cat([given["attention_mask"], torch.ones_like(tokens[:, :, 0])], dim=1)
        out = self.model(
            hidden_states=tokens,
            encoder_hidden_states=encoder_hidden_states,
            timestep=timestep / 1000,
            img_ids=image_ids,
            txt_ids=text_ids,
            **given,
            return_dict=False,
        )[0]
        return unpack(out, hidden_states)


def transformer(family: Family, component: Component, model) -> torch.nn.Module:
    """A transformer as its family feeds it: packed into patches inside the graph or as it is."""
    cls = PackedTransformer if family.traits.latent_packing > 1 else Transformer
    return cls(family, component, model)


# component kind → its exporter: a module class or a function choosing one, each called (family, component, model)
EXPORTERS = {
    "text_encoder": TextEncoder,
    "transformer": transformer,
    "unet": UNet,
    "unet_controlnet": UNetWithResiduals,
    "controlnet": ControlNet,
    "vae_decoder": VaeDecoder,
    "vae_encoder": VaeEncoder,
}
