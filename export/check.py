"""The checks an export must pass before it is written: the ONNX file's inputs and outputs are the family
table's (names, types, dims), and ONNX Runtime agrees with torch at the export shape and at a second one (another
batch and latent size, so every dim declared dynamic is shown to be)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from enginefarm.errors import ConfigError, ExportError
from enginefarm.families import TOKENS, Tensor

# Max |ONNX Runtime - torch| over the reference's range, per output: fp32 kernels differ in summation order only,
# which grows with depth and output size (tiny models: under 2e-6; SDXL at real size: UNet 8.5e-7, VAE decoder
# 1.5e-4 at 2 x 1024x1024, its worst of 6.3 M values). A wrong op or layout moves outputs by 1e-2 and more.
MAX_DEVIATION = 1e-3

_ONNX_TYPES = {"float32": 1, "int64": 7}


@dataclass(frozen=True)
class Shape:
    """A point to run a component at: batch and latent height/width (pixel dims follow at the VAE's scale), and for
    the transformer families the T5 token count and the transformer's text tokens that follow from it."""

    batch: int
    height: int
    width: int
    text_length: int = 0
    context_tokens: int = 0
    prompt_tokens: int = TOKENS  # the UNet families' text tokens (chunks of 77)

    @property
    def label(self) -> str:
        return (
            f"batch {self.batch}, latent {self.height}x{self.width}"
            + (f", {self.text_length} T5 tokens" if self.text_length else "")
            + (f", {self.prompt_tokens} prompt tokens" if self.prompt_tokens != TOKENS else "")
        )

    def resolve(self, tensor: Tensor, scale: int) -> list[int]:
        """`tensor`'s concrete shape here: dynamic dims from this point (`image_*` at `scale`, `height_divN`)."""
        dims = {
            "batch": self.batch,
            "height": self.height,
            "width": self.width,
            "image_height": self.height * scale,
            "image_width": self.width * scale,
            "text_length": self.text_length,
            "context_tokens": self.context_tokens,
            "prompt_tokens": self.prompt_tokens,
        }
        return [
            d if isinstance(d, int) else dims.get(d) or dims[d.partition("_div")[0]] // int(d.partition("_div")[2])
            for d in tensor.shape
        ]


def check_contract(path: Path, name: str, inputs: tuple[Tensor, ...], outputs: tuple[Tensor, ...]) -> None:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    problems = []
    for kind, declared, found in (("input", inputs, graph.input), ("output", outputs, graph.output)):
        if [t.name for t in declared] != [v.name for v in found]:
            problems.append(
                f"{kind}s are {[v.name for v in found]}, the family table says {[t.name for t in declared]}"
            )
            continue
        for tensor, value in zip(declared, found, strict=True):
            ttype = value.type.tensor_type
            dims = [
                d.dim_param if d.HasField("dim_param") else d.dim_value if d.HasField("dim_value") else "?"
                for d in ttype.shape.dim
            ]
            if ttype.elem_type != _ONNX_TYPES[tensor.dtype]:
                problems.append(f"{kind} {tensor.name} has ONNX type {ttype.elem_type}, not {tensor.dtype}")
            if dims != list(tensor.shape):
                problems.append(f"{kind} {tensor.name} has dims {dims}, the family table says {list(tensor.shape)}")
    if problems:
        raise ExportError(f"{name}: the exported ONNX does not match the family table: {'; '.join(problems)}")


def torch_outputs(module, cases: list[tuple[Shape, tuple]]) -> list[list]:
    """`module`'s outputs (numpy) for each case: computed before ONNX Runtime loads the file, so the torch model can
    be dropped first and the two never hold the weights at once."""
    import torch

    results = []
    for _, example in cases:
        with torch.no_grad():
            expected = module(*example)
        results.append([t.numpy() for t in (expected if isinstance(expected, tuple) else (expected,))])
    return results


def compare_with_torch(
    path: Path,
    name: str,
    expected_outputs: list[list],
    cases: list[tuple[Shape, tuple]],
    outputs: tuple[Tensor, ...],
    scale: int,
    limit: float | None = None,
) -> dict[str, float]:
    """Run the ONNX file on ONNX Runtime (CPU) for each case and compare with torch's outputs (`torch_outputs`): the
    worst deviation per case (max |difference| over the output's range), or ExportError naming the output that
    missed."""
    import numpy as np
    import onnxruntime as ort

    limit = MAX_DEVIATION if limit is None else limit
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    worst: dict[str, float] = {}
    for (shape, example), expected in zip(cases, expected_outputs, strict=True):
        got = session.run(None, {n: t.numpy() for n, t in zip(names, example, strict=True)})
        deviation = 0.0
        for tensor, want, have in zip(outputs, expected, got, strict=True):
            declared = shape.resolve(tensor, scale)
            if not (list(want.shape) == list(have.shape) == declared):
                raise ExportError(
                    f"{name}: output {tensor.name} is {list(have.shape)} on ONNX Runtime, {list(want.shape)} on torch, "
                    f"{declared} by the family table at {shape.label}"
                )
            if not np.all(np.isfinite(want)):  # torch's own output: the weights or config, not the exporter
                raise ConfigError(
                    f"{name}: torch's own output {tensor.name} holds NaN or inf at {shape.label}: its weights (or "
                    "config) are broken, not the export",
                    hint="check the checkpoint (a fp16 overflow, a damaged download): re-save or re-download it",
                )
            deviation = max(deviation, deviation_of(want, have, name, f"{tensor.name} at {shape.label}", limit))
        worst[shape.label] = deviation
    return worst


def example_inputs(
    inputs: tuple[Tensor, ...], ranges: dict[str, tuple[float, float]], shape: Shape, scale: int, seed: int
) -> tuple:
    """Seeded torch inputs at `shape`, each in its validation range (residuals and others: -1..1)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    tensors = []
    for tensor in inputs:
        size = shape.resolve(tensor, scale)
        low, high = ranges.get(tensor.name, (-1.0, 1.0))
        if tensor.dtype == "int64":
            tensors.append(torch.randint(int(low), int(high) + 1, size, generator=generator, dtype=torch.int64))
        else:
            tensors.append(low + (high - low) * torch.rand(size, generator=generator, dtype=torch.float32))
    return tuple(tensors)


def deviation_of(want, have, name: str, where: str, limit: float) -> float:
    """max |ONNX Runtime - torch| as a share of torch's output range; past `limit` (or not finite), the export
    stops with one ExportError line naming `name` and `where` (the output and the shape)."""
    import numpy as np

    spread = float(np.ptp(want)) or 1.0
    error = float(np.max(np.abs(want.astype(np.float64) - have))) / spread
    if not np.isfinite(error) or error > limit:
        raise ExportError(
            f"{name}: ONNX Runtime differs from torch by {error:.3g} of the output range in {where} (limit {limit:g})",
            hint="this is a bug in the exporter or an op the ONNX export cannot express; nothing was written",
        )
    return error
