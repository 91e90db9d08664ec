"""A job that runs out of memory, said as what it is: the size it asked for, the profile that made it that large,
and the options that shrink it. An SDK says it in its own words (ONNX Runtime's arena, OpenVINO's allocator, numpy,
C++'s bad_alloc), often past where a message is cut; a process the kernel kills for memory says nothing."""

from __future__ import annotations

import re

from enginefarm.errors import OutOfMemory

from .memory import LATENT_SCALE, gb, job_need_bytes

# What each SDK says when an allocation fails, with the size where it gives one (bytes, or numpy's "1.5 GiB").
_SIZED = (
    re.compile(r"(?:requested buffer of size|AllocateRawInternal\(size[^)]*\)\D*|allocate memory of size)\s*(\d+)"),
    re.compile(r"Unable to allocate ([\d.]+) ([KMGTP]i?B)"),
    re.compile(r"Failed to allocate (\d+) bytes"),
)
_UNSIZED = re.compile(
    r"bad_alloc|MemoryError|out of memory|Cannot allocate memory|Failed to allocate memory|AllocateRawInternal",
    re.IGNORECASE,
)
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
KILLED = -9  # a subprocess's return code when the kernel's OOM killer (or anyone) sent SIGKILL


def asked_bytes(text: str) -> int | None:
    """The allocation an SDK's error says failed: its size in bytes, 0 when it names none, None when the error is
    not about memory."""
    for pattern in _SIZED:
        found = pattern.search(text)
        if found:
            if len(found.groups()) == 2:
                return int(float(found.group(1)) * _UNITS[found.group(2)[0]])
            return int(found.group(1))
    return 0 if _UNSIZED.search(text) else None


def largest_case(job) -> str:
    """The profile's largest case in a user's units: "batch 2, 768x768 px" (or the latent/image shape's max)."""
    for tensor in job.inputs:
        largest = job.profile.get(tensor.name, {}).get("max")
        if largest and len(largest) == 4:
            image = tensor.dims[1] == 3
            height, width = (
                (largest[2], largest[3]) if image else (largest[2] * LATENT_SCALE, largest[3] * LATENT_SCALE)
            )
            return f"batch {largest[0]}, {width}x{height} px"
    shapes = [f"{t.name} {job.profile[t.name]['max']}" for t in job.inputs if t.name in job.profile]
    return ", ".join(shapes) or "its largest case"


def out_of_memory(job, where: str, asked: int) -> OutOfMemory:
    """The job's error for an allocation that failed in `where` ("the fp32 reference run", "validation"...)."""
    size = f"asked for {gb(asked):g} GB at once" if asked > 0 else "ran out of memory"
    return OutOfMemory(
        f"{job.label}: {where} {size} at the profile's largest case ({largest_case(job)}; the plan counted "
        f"{gb(job_need_bytes(job)):g} GB for the job): the profile {job.profile_name!r} is too large for this "
        "machine's memory",
        asked=asked,
        hint=f"shrink the profile: lower batch, height and width in [components.{job.component}.profiles."
        f"{job.profile_name}] of {job.recipe_path.name}, or export again with smaller `enginefarm export --batch "
        "MIN,OPT,MAX --latent MIN,OPT,MAX`; or build it on a machine with more memory (`enginefarm plan --runners`)",
    )
