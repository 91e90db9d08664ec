"""One rule table for every vendor, over realistic device descriptors. The SDKs are not on this machine, so
`can_load` says every backend loads; what is under test is the ranking and the constraint filters."""

from __future__ import annotations

import pytest

from enginefarm.backends.base import Availability
from enginefarm.cache.index import IndexEntry
from enginefarm.hardware import devices as found
from enginefarm.hardware.devices import Device
from enginefarm.runner.detect import with_targets
from enginefarm.runner.resolve import resolve


def nvidia_device(*args, **kwargs) -> Device:
    """A detected device: the machine's description (hardware/devices.py) with its targets, as detection fills them."""
    return with_targets(found.nvidia_device(*args, **kwargs))


def amd_device(*args) -> Device:
    return with_targets(found.amd_device(*args))


def apple_device(*args) -> Device:
    return with_targets(found.apple_device(*args))


CPU = Device("cpu", "Ryzen 7 5800X", "cpu-x86_64-v3", ("openvino:cpu", "onnxruntime:cpu"), {"os": "linux"})


NAMES: dict[str, str] = {}  # build key → the letter a test names an entry by


def key(name: str) -> str:
    """A hex build key that starts with the entry's letter where the letter is a hex digit."""
    return (name if name in "abcdef" else "0123456789"["ghijklmnop".index(name)]) * 64


def entry(name: str, target: str, bench: tuple[str, float] | None = None, precision: str = "fp16", **constraints):
    NAMES[key(name)] = name
    return IndexEntry.from_dict(
        {
            "build_key": key(name),
            "component": "vae",
            "precision": precision,
            "target": target,
            "profile_name": "default",
            "profile": {},
            "constraints": constraints,
            "benchmarks": [{"device": {"class": bench[0]}, "p50_ms": bench[1]}] if bench else [],
        },
        "sd15",
    )


FARM = [
    entry("a", "tensorrt:sm_86", ("nvidia-sm_86", 10.0)),
    entry("b", "tensorrt:sm_89", ("nvidia-sm_89", 5.0)),
    entry("c", "tensorrt:ampere+", ("nvidia-sm_86", 11.0), min_driver="535"),
    entry("d", "tensorrt-rtx:ampere+", ("nvidia-sm_89", 6.0)),
    entry("j", "tensorrt-rtx:turing+", ("nvidia-sm_75", 30.0)),
    entry("e", "migraphx:gfx1100", ("amd-gfx1100", 9.0), vram_mb=8000),
    entry("f", "openvino:gpu", ("intel-gpu", 20.0)),
    entry("g", "coreml:apple", ("apple-m2-pro", 15.0), os=["darwin"]),
    entry("h", "openvino:cpu", ("cpu-x86_64-v3", 200.0), precision="fp32"),
    entry("i", "onnxruntime:cpu", ("cpu-x86_64-v3", 180.0), precision="fp32"),
]

ARC = Device("intel-gpu", "Intel(R) Arc(TM) A770 Graphics", "intel-gpu", ("openvino:gpu",), {"vram_mb": 16384})

DEVICES = [
    # (name, devices, expected pick, words the explanation must contain)
    (
        "RTX 3060",
        [nvidia_device("NVIDIA GeForce RTX 3060", 8, 6, "550.54.14", 12288), CPU],
        "a",
        "most specific engine kind",
    ),
    ("RTX 4090", [nvidia_device("NVIDIA GeForce RTX 4090", 8, 9, "550.54.14", 24564), CPU], "b", "exact-arch engine"),
    (
        "RTX 5090",
        [nvidia_device("NVIDIA GeForce RTX 5090", 12, 0, "570.86", 32607), CPU],
        "c",
        "hardware-compatible engine",
    ),
    ("GTX 1660", [nvidia_device("NVIDIA GeForce GTX 1660", 7, 5, "550.54.14", 6144), CPU], "j", "JIT-able engine"),
    ("RX 7900 XTX", [amd_device("AMD Radeon RX 7900 XTX", "gfx1100", 24560), CPU], "e", "migraphx:gfx1100"),
    ("Arc A770", [ARC, CPU], "f", "openvino:gpu"),
    (
        "M2 Pro",
        [
            apple_device("Apple M2 Pro", "14.4"),
            Device("cpu", "Apple M2 Pro", "cpu-aarch64-base", ("openvino:cpu", "onnxruntime:cpu"), {"os": "darwin"}),
        ],
        "g",
        "coreml:apple",
    ),
    ("CPU only", [CPU], "i", "fastest measured: 180.0 ms vs 200.0 ms"),
]


def pick(devices, entries=FARM, precision=None):
    resolution = resolve(
        "sd15/vae",
        [(e, "store") for e in entries],
        precision,
        devices,
        can_load=lambda target: Availability(True, True),
    )
    ranked = resolution.ranked
    chosen = ranked[0] if ranked else None
    return (NAMES[chosen.entry.build_key] if chosen else None), resolution.explain(chosen)


@pytest.mark.parametrize("name,devices,expected,words", DEVICES, ids=[d[0] for d in DEVICES])
def test_each_device_gets_the_right_engine(name, devices, expected, words):
    chosen, explanation = pick(devices)
    assert chosen == expected, explanation
    assert f"[{key(expected)[:12]}]" in explanation.splitlines()[1]
    assert words in explanation


def test_old_driver_falls_back_to_the_jit_engine():
    chosen, explanation = pick([nvidia_device("NVIDIA GeForce RTX 5090", 12, 0, "530.30", 32607), CPU])
    assert chosen == "d"
    assert "needs driver 535 or newer, this has 530.30" in explanation


def test_too_little_vram_falls_back_to_the_cpu():
    chosen, explanation = pick([amd_device("AMD Radeon (4 GB)", "gfx1100", 4096), CPU])
    assert chosen == "i"
    assert "needs 8000 MiB of VRAM, this GPU has 4096" in explanation


def test_an_unknown_gpu_uses_the_cpu_and_says_why():
    chosen, explanation = pick([amd_device("AMD Radeon RX 6600", "gfx1032", 8192), CPU])
    assert chosen == "i"
    assert "no device here runs migraphx:gfx1100" in explanation


def test_os_constraint():
    linux_apple = Device("apple", "Asahi M2", "apple-m2", ("coreml:apple",), {"os": "linux"})
    chosen, explanation = pick([linux_apple, CPU])
    assert chosen == "i" and "built for darwin, this is linux" in explanation


def test_backends_this_machine_cannot_load_are_skipped_with_the_reason():
    resolution = resolve(
        "sd15/vae", [(e, "store") for e in FARM], None, [nvidia_device("RTX 4090", 8, 9, "550", 24564), CPU]
    )
    assert resolution.ranked[0].entry.target in ("onnxruntime:cpu", "openvino:cpu")
    assert "cannot load here: tensorrt is not installed" in resolution.explain()


@pytest.mark.parametrize(
    "cc,has,lacks",
    [
        ((7, 5), {"tensorrt:sm_75", "tensorrt-rtx:turing+"}, {"tensorrt:ampere+"}),
        (
            (8, 6),
            {"tensorrt:sm_86", "tensorrt:ampere+", "tensorrt-rtx:ampere+", "tensorrt-rtx:turing+"},
            {"tensorrt-rtx:ada+"},
        ),
        ((12, 0), {"tensorrt:sm_120", "tensorrt:ampere+", "tensorrt-rtx:blackwell+", "tensorrt-rtx:ada+"}, set()),
        # The A100 (8.0) runs hardware-compatible TensorRT plans, but TensorRT-RTX does not list it at all.
        (
            (8, 0),
            {"tensorrt:sm_80", "tensorrt:ampere+"},
            {"tensorrt-rtx:sm_80", "tensorrt-rtx:ampere+", "tensorrt-rtx:turing+"},
        ),
    ],
)
def test_nvidia_target_classes(cc, has, lacks):
    targets = set(nvidia_device("GPU", *cc, driver="580.00", vram_mb=8192).targets)
    assert has <= targets and not (lacks & targets)
