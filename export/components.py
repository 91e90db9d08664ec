"""Each kind of component as a torch module with the ONNX contract's signature: the diffusers or transformers
model loaded from its folder (fp32), wrapped (export/wrappers.py, one exporter per kind) so that its inputs and
outputs are exactly the family table's, in its order. torch, diffusers and transformers are imported inside the
functions (the `export` extra)."""

from __future__ import annotations

import logging
from pathlib import Path

from enginefarm.families import Component, Family

from .config_size import model_class
from .source import ExportSource

log = logging.getLogger(__name__)


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


def wrap(family: Family, component: Component, model):
    """`model` as a module whose forward takes the component's inputs positionally and returns its outputs: the
    exporter of the component's kind (export/wrappers.py), which reads the family's traits where they matter."""
    from .wrappers import EXPORTERS

    return EXPORTERS[component.kind](family, component, model).eval()


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
