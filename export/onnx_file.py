"""torch module → one ONNX file (opset 17, IR 10), its weights inline or in one `<name>.onnx.data` beside it."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

from enginefarm.families import Tensor, is_dynamic
from enginefarm.formats.onnx_data import external_tensors, write_model

OPSET = 17
# onnx 1.23 writes IR 14, which older readers (onnxruntime before 1.32, some vendor parsers) refuse; opset 17 needs 8.
MAX_IR_VERSION = 10
# protobuf cannot serialize a message of 2 GiB; the graph itself needs some room beside the weights.
EXTERNAL_DATA_ABOVE = 2_000_000_000


def dynamic_axes(tensors: tuple[Tensor, ...]) -> dict[str, dict[int, str]]:
    return {t.name: {axis: str(dim) for axis, dim in enumerate(t.shape) if is_dynamic(dim)} for t in tensors}


def export_onnx(
    module,
    example: tuple,
    inputs: tuple[Tensor, ...],
    outputs: tuple[Tensor, ...],
    path: Path,
    external_data_above: int = EXTERNAL_DATA_ABOVE,
) -> bool:
    """Write `module` traced at `example` to `path`; True when its weights went to `path.name + ".data"`.
    Traced with the TorchScript exporter (dynamo=False), which handles the UNet families' control flow."""
    import onnx
    import torch

    raw = path.parent / f".raw-{path.stem}"
    shutil.rmtree(raw, ignore_errors=True)  # left by an export killed while tracing (no `finally` ran): ours to redo
    raw.mkdir()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter(
                "ignore"
            )  # tracer warnings about Python branches on shapes, the exporter's deprecation
            torch.onnx.export(
                module,
                example,
                str(raw / path.name),
                input_names=[t.name for t in inputs],
                output_names=[t.name for t in outputs],
                dynamic_axes=dynamic_axes(inputs + outputs),
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
        header = onnx.load(str(raw / path.name), load_external_data=False)
        header.ir_version = min(header.ir_version, MAX_IR_VERSION)
        declare_shapes(header, inputs, outputs)
        if external_tensors(header):
            # torch writes a model over 2 GB as one file per tensor: they are gathered into one data file a chunk at a
            # time, so the export never holds the weights twice (the SDXL UNet's 10.3 GB beside torch's own copy).
            write_model(header, raw, path)
            return True
        weights = sum(t.ByteSize() for t in header.graph.initializer)
        external = weights > external_data_above
        onnx.save_model(
            header,
            str(path),
            save_as_external_data=external,
            all_tensors_to_one_file=True,
            location=f"{path.name}.data" if external else None,
            size_threshold=1024,
        )
    finally:
        shutil.rmtree(raw)
    return external


def declare_shapes(proto, inputs: tuple[Tensor, ...], outputs: tuple[Tensor, ...]) -> None:
    """Write the family table's dims on the graph's inputs and outputs. The tracer leaves some it could not
    infer as generated names (the text encoder's 77 tokens after its layer norm); the checks that follow run the
    model at two shapes and compare every output's shape with these, so nothing is declared that is not true."""
    for declared, values in ((inputs, proto.graph.input), (outputs, proto.graph.output)):
        by_name = {v.name: v for v in values}
        for tensor in declared:
            if tensor.name not in by_name:
                continue  # check_contract names what is missing
            shape = by_name[tensor.name].type.tensor_type.shape
            del shape.dim[:]
            for dim in tensor.shape:
                entry = shape.dim.add()
                if isinstance(dim, int):
                    entry.dim_value = dim
                else:
                    entry.dim_param = dim


def files_of(path: Path) -> list[Path]:
    """The ONNX file and, when it has one, its external data."""
    data = path.with_name(path.name + ".data")
    return [path, data] if data.exists() else [path]
