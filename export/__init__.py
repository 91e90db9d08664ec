"""`enginefarm export`: a diffusers pipeline folder (or a ControlNet) → one checked ONNX file per component,
its checkpoint in diffusers names, the assets a runtime needs and a recipe that builds them all.

Needs the `export` extra (torch, diffusers, transformers); they are imported inside functions only, so importing
this package is cheap and works without them."""

from __future__ import annotations

from .run import ComponentExport, ExportResult, export_model

__all__ = ["ComponentExport", "ExportResult", "export_model"]
