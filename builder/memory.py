"""What one build job needs in memory, known before it runs: the executor starts jobs only while their needs
fit the machine, and `plan --runners` routes a job only to a runner with that much memory.

A job's peak resident memory is bounded by its source's weights (docs/large-models.md, "Real sizes"): no stage
holds more than the model twice over, the model and the artifact are never in memory in the same process, and
a fixed part (the interpreter, onnx, ONNX Runtime, OpenVINO, onnxsim) stays the same for any model:

    need = max(FACTOR × weights, weights + BASE)     (FACTOR 2.5; 2.2 for OpenVINO and ONNX Runtime, 3.0 for
                                                       the NVIDIA builders; HALF_FACTOR 2.0 for fp16 and bf16 jobs)

`weights` counts every float tensor at 4 bytes an element, whatever the source stores: a source saved in fp16 or
bf16 is still validated against ONNX Runtime's run of it, and the CPU backends hold fp32 copies of fp16 weights while
they compile and run. Counting file bytes would halve the need of an fp16 source (Flux: 60 GB instead of 119).

An fp16 or bf16 job's artifact is half the size, and its peaks stay under 2x the fp32 weights (the highest: the
source's fp32 reference run, shared by every job of the source); HALF_FACTOR covers them with a margin. The measured
peaks behind FACTOR and HALF_FACTOR are in docs/benchmarks.md, "Measurements behind the code".

Attention, not only the weights, decides the need at large images (`attention_bytes`): the exported graphs
materialize every score matrix, heads x tokens² fp32 values per item, and the fp32 reference (which runs a batch an
item at a time) holds about three of one item's at once. A diffusion transformer's tokens are its 2x2 latent patches
plus the text; SD3.5 Medium's (24 heads) at 1024 px are 4,685 tokens, 2.1 GB a matrix per item.
A UNet's largest is
its self-attention at the highest resolution that has attention: every latent pixel a token in SD 1.x and 2.x (so SD
1.5 at 1024 px holds 8.6 GB per matrix and item), every 2x2 in SDXL. A VAE's mid-block attends over its latent
pixels with one head. The need is then weights + BASE + the attention; the recipe names the heads and the tokens'
size (`[components.X.resources] attention_heads`, `attention_downscale`, which `enginefarm export` writes from the
component's config) and the profile gives the tokens.

A VAE's activations, not its weights, decide the rest of its need (`image_activation_bytes`): its widest level,
in channels at full image resolution (`activation_channels`, from its config's block_out_channels: SD's VAE 256),
ACTIVATION_COPIES times at the profile's largest image, which stays above the decoders' measured peaks. A VAE recipe
without `activation_channels` gets a rule fitted to two measured peaks, SDXL's and SD 1.5's decoders
(`image_need_gb`; docs/benchmarks.md).

A recipe's `[components.X.resources] host_ram_gb` raises a component's need, never lowers it.
"""

from __future__ import annotations

import math
from pathlib import Path

from enginefarm.backends import Backend, get_backend
from enginefarm.cache import precision_table
from enginefarm.errors import BackendUnavailable

FACTOR = Backend.build_memory_factor  # a backend may state its own
HALF_FACTOR = 2.0
BASE = 3 << 30  # 3 GiB: the interpreter and SDKs, onnxsim's working copies and activations at the profile's max


def source_weight_bytes(path: Path) -> int:
    """The weights at fp32: the model file plus its external data files, with each tensor of a reduced precision
    counted at its fp32 size (a file holds the graph's few MB beside them; a need is never understated)."""
    from enginefarm.formats.onnx_io import check_external_data, load_header

    header = load_header(path)
    files = [path, *check_external_data(header, path)]
    return sum(f.stat().st_size for f in files) + widening_bytes(header)


# ONNX element type -> bytes one value grows by at fp32, for the table's reduced precisions (float16, bfloat16: 2).
_WIDENING = {p.onnx_type: (32 - p.bits) // 8 for p in precision_table.TABLE.values() if p.reduced}


def widening_bytes(header) -> int:
    """What the reduced-precision tensors of a graph (initializers and constants, inline or external) would add at
    fp32: as much as they occupy as stored for fp16 and bf16."""
    from onnx.external_data_helper import _get_all_tensors

    total = 0
    for tensor in _get_all_tensors(header):
        grows = _WIDENING.get(tensor.data_type)
        if grows:
            total += grows * math.prod(tensor.dims)
    return total


def need_bytes(
    weight_bytes: int, host_ram_gb: float = 0.0, backend: str = "", precision: str = "fp32", activations: int = 0
) -> int:
    # A backend states its own factor (Backend.build_memory_factor): NVIDIA's builders hold the parsed weights, the
    # engine's copy and its serialization at once (the SD 1.5 UNet fp32 peaks at 2.95x its weights in TensorRT-RTX,
    # fp16 at 1.74x).
    factor = _backend_factor(backend) if backend else FACTOR
    if precision_table.reduced(precision):
        factor = min(factor, HALF_FACTOR)
    return max(int(factor * weight_bytes), weight_bytes + BASE + activations, int(host_ram_gb * 1e9))


def _backend_factor(name: str) -> float:
    try:
        return get_backend(name).build_memory_factor
    except BackendUnavailable:
        return FACTOR


def job_need_bytes(job) -> int:
    resources = job.resources
    megapixels = image_megapixels(job.inputs, job.outputs, job.profile)
    activations = image_activation_bytes(resources.activation_channels, megapixels)
    # Without the VAE's own widths (a hand-written recipe), the rule fitted to the real SD VAEs' measured peaks.
    fitted = 0.0 if resources.activation_channels else image_need_gb(megapixels)
    host_ram_gb = max(resources.host_ram_gb, fitted)
    tokens = attention_tokens(job.inputs, job.profile, resources.attention_downscale)
    attention = attention_bytes(resources.attention_heads, *tokens)
    return need_bytes(job.weight_bytes, host_ram_gb, job.target.backend, job.precision, attention + activations)


ATTENTION_COPIES = 3  # the scores, their scaling and the softmax of one item, alive at once in the fp32 reference
PATCH = 2  # latent pixels per token side in every diffusion-transformer family (SD3, Flux, Chroma)


def attention_tokens(inputs, profile, downscale: int = 0) -> tuple[int, int]:
    """(batch, tokens) of the largest attention at the profile's max.

    `downscale` 0: a diffusion transformer's joint attention: image tokens from its 4-D latent input (2x2 patches)
    plus text tokens from its 3-D token sequence input [batch, tokens, width]. `downscale` n: self-attention over
    the image tokens alone, one per n x n latent pixels (a UNet's attention at its highest resolution: SD 1.x n = 1,
    SDXL n = 2; a VAE's mid-block at its latent resolution, n = 1), from a latent input or an image input (at
    LATENT_SCALE). (0, 0) without such an input."""
    patch = downscale or PATCH
    batch = image = text = 0
    for tensor in inputs:
        largest = profile.get(tensor.name, {}).get("max")
        if not largest:
            continue
        if len(largest) == 4 and (downscale or not _is_image(tensor)):
            scale = LATENT_SCALE if _is_image(tensor) else 1
            tokens = (largest[2] // scale // patch) * (largest[3] // scale // patch)
            batch, image = max(batch, largest[0]), max(image, tokens)
        elif len(largest) == 3 and not downscale:
            text = max(text, largest[1])
    return (batch, image + text) if image else (0, 0)


def attention_bytes(heads: int, batch: int, tokens: int) -> int:
    """What one attention holds at once, in heads x tokens² fp32 score matrices: ATTENTION_COPIES of one item's, or
    one of the whole batch's, whichever is more. The fp32 reference runs the exported graph unfused on purpose (the
    independent check of a fused artifact), a batch an item at a time (`validate.reference_outputs`), and any job of
    a source may be the one that runs it; onnxruntime:cpu's artifacts fuse attention into MultiHeadAttention and hold
    no score matrix, while OpenVINO's validation at the full batch held about one (SD 1.5's UNet at fp32, batch 2 x
    768 px: 9.3 GB, its 3.4 GB of weights and a 5.4 GB matrix)."""
    return max(ATTENTION_COPIES, batch) * heads * tokens * tokens * 4


# A VAE's convolutions at its widest level: the input, the normalized copy and the output of a resnet at once.
ACTIVATION_COPIES = 3


def image_activation_bytes(channels: int, megapixels: float) -> int:
    """A VAE's activations at the profile's largest image (batch x megapixels), from its widest level in channels
    at full image resolution (`Resources.activation_channels`, from its config's block_out_channels); 0 without."""
    return int(ACTIVATION_COPIES * channels * 4 * megapixels * 1e6)


# Fitted to the two measured VAE decoder peaks above, for a VAE recipe that does not state its widths: about 1.5 GB
# plus 6 GB per megapixel (times the batch).
IMAGE_GB_BASE, IMAGE_GB_PER_MEGAPIXEL = 1.5, 6.0
LATENT_SCALE = 8  # image pixels per latent pixel, in every SD-class VAE


def image_megapixels(inputs, outputs, profile) -> float:
    """Batch x megapixels of the largest RGB image a VAE-like job (one input, one output, one of them an image
    [batch, 3, H, W]) takes or makes at its profile's max; 0 for any other job. An image output is its latent input
    scaled by LATENT_SCALE. A ControlNet's image input does not count: its activations at image size are few."""
    if len(inputs) != 1 or len(outputs) != 1:
        return 0.0
    (source,), (result,) = inputs, outputs
    largest = profile[source.name]["max"]
    if _is_image(source):
        return largest[0] * largest[2] * largest[3] / 1e6
    if _is_image(result) and len(largest) == 4:
        return largest[0] * largest[2] * largest[3] * LATENT_SCALE**2 / 1e6
    return 0.0


def _is_image(tensor) -> bool:
    return len(tensor.dims) == 4 and tensor.dims[1] == 3


def image_need_gb(megapixels: float) -> float:
    return IMAGE_GB_BASE + IMAGE_GB_PER_MEGAPIXEL * megapixels if megapixels else 0.0


def total_bytes() -> int:
    """The machine's memory in all."""
    import psutil

    return int(psutil.virtual_memory().total)


def too_big_here(need: int, total: int | None = None) -> str:
    """Why a job whose need is over the machine's whole memory is not started here (`build` without --memory), and
    what it would take; "" when it fits. It would swap or be killed after its first stages, not fail at once."""
    total = total_bytes() if total is None else total
    if need <= total:
        return ""
    return (
        f"needs {gb(need):g} GB, this machine has {gb(total):g} GB in all: build it on a runner with at least "
        f"{gb(need):g} GB (`enginefarm plan --runners FILE` routes it), or pass "
        "`build --memory` to try it here anyway"
    )


def available_bytes() -> int:
    """What the machine can give builds now: memory not in use by anything else."""
    import psutil

    return int(psutil.virtual_memory().available)


def gb(value: int) -> float:
    """GB rounded up to a tenth: a need is never understated."""
    return math.ceil(value / 1e8) / 10
