"""Finding an artifact's file of one role (its ONNX model, IR, engine, weight map) in its manifest, for the
backends' loaders and the runner's custom weights and on-device compiles."""

from __future__ import annotations

from enginefarm.errors import IntegrityError


def role_file(manifest, role: str) -> str:
    """The path of the artifact's file of `role` (its ONNX model, IR, engine). A manifest without one names an
    artifact no loader can open: a one-line IntegrityError, not a StopIteration from inside the loader."""
    return role_entry(manifest, role).path


def role_entry(manifest, role: str):
    """The manifest's file entry of `role` (path, size, digest), or the IntegrityError of `role_file`."""
    for entry in manifest.files:
        if entry.role == role:
            return entry
    roles = ", ".join(sorted({f.role for f in manifest.files})) or "none"
    raise IntegrityError(
        f"{manifest.ref} [{manifest.build_key[:12]}]: its manifest lists no {role} file, which {manifest.target} needs "
        f"(it lists: {roles})",
        key=manifest.build_key,
        hint="the store's manifest is incomplete or from another tool: rebuild it with `enginefarm build`",
    )
