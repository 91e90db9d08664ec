"""The build step that writes a component's weight map (`formats/weightmap.py`) beside its artifact and lists it in
the manifest, trimmed to what the backend's artifact holds."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from enginefarm.backends.base import Feature
from enginefarm.cache.manifest import ArtifactFile, Manifest
from enginefarm.errors import BuildError
from enginefarm.formats.safetensors_io import SafeTensors
from enginefarm.formats.weightmap import MAP_FILE, base_digests, derive


def attach(
    manifest: Manifest, outdir: Path, backend, checkpoint: Path, checkpoint_sha256: str, prepared_fp32: Path
) -> Manifest:
    """Derive the map, drop what the backend's artifact does not hold, write it beside the artifact and list it
    in the manifest (role "map"), so it is hashed like every other file."""
    from enginefarm.cache.atomic import sha256_file

    found = derive(checkpoint, checkpoint_sha256, prepared_fp32)
    if not found.mapped:  # a wrong file (a LoRA, another model's weights): an empty map would only fail at load
        raise BuildError(
            f"checkpoint {checkpoint.name}: none of its {len(found.unmatched)} tensor(s) holds a weight of this model",
            hint="`checkpoint =` must be this component's own base weights (the state dict it was exported from)",
        )
    if backend.has(Feature.PATCH_WEIGHTS):
        present = backend.weight_shapes(outdir, manifest)
        ckpt = SafeTensors(checkpoint)
        for name, m in list(found.mapped.items()):
            if present.get(m.initializer) != m.onnx_shape:
                del found.mapped[name]
                found.unmatched[name] = (
                    f"{m.initializer} is not a patchable weight of the {manifest.parsed_target.backend} artifact"
                )
                found.digests[name] = base_digests(ckpt, name)
    path = outdir / MAP_FILE
    path.write_bytes(found.to_json())
    size, digest = path.stat().st_size, sha256_file(path)
    notes = {**manifest.provenance, "weight_map": {"mapped": len(found.mapped), "unmatched": sorted(found.unmatched)}}
    return replace(
        manifest,
        files=manifest.files + (ArtifactFile(MAP_FILE, "map", size, digest, "none", size, digest),),
        provenance=notes,
    )
