"""The strict safetensors reader: real files from the safetensors package read back exactly; hostile headers are
clear WeightsErrors that allocate nothing."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from enginefarm.errors import WeightsError
from enginefarm.formats.safetensors_io import MAX_HEADER, SafeTensors, write_safetensors
from tests import models


def test_reads_what_the_safetensors_package_writes(tmp_path):
    tensors = {
        "a.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.linspace(-2, 2, 5).astype(np.float16),
        "ids": np.arange(4, dtype=np.int64),
    }
    st = SafeTensors(models.write_safetensors(tmp_path / "x.safetensors", tensors))
    assert sorted(st.names) == ["a.weight", "b", "ids"]
    assert np.array_equal(st.array("a.weight"), tensors["a.weight"])
    assert st.array("b").dtype == np.float32 and np.array_equal(st.array("b"), tensors["b"].astype(np.float32))
    assert np.array_equal(st.raw("ids"), tensors["ids"])
    with pytest.raises(WeightsError, match="not a float tensor"):
        st.array("ids")


def test_bf16_is_widened_exactly(tmp_path):
    from safetensors.numpy import save_file

    values = np.array([1.5, -2.25, 3.0e-3], np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    path = tmp_path / "bf16.safetensors"
    save_file({"w": bits}, str(path))  # written as U16, then relabelled BF16 in the header below
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = raw[8 : 8 + n].replace(b'"U16"', b'"BF16"')
    path.write_bytes(struct.pack("<Q", len(header)) + header + raw[8 + n :])
    assert np.array_equal(SafeTensors(path).array("w"), (bits.astype(np.uint32) << 16).view(np.float32))


def test_our_writer_round_trips_through_the_package(tmp_path):
    from safetensors.numpy import load_file

    tensors = {"onnx::MatMul_1": np.ones((2, 3), np.float32), "h": np.zeros(4, np.float16)}
    write_safetensors(tmp_path / "w.safetensors", tensors)
    back = load_file(str(tmp_path / "w.safetensors"))
    assert all(np.array_equal(back[k], v) and back[k].dtype == v.dtype for k, v in tensors.items())


def _file(tmp_path, header, data: bytes = b"", length: int | None = None):
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return path


@pytest.mark.parametrize(
    "header, data, length, message",
    [
        (b"", b"", 2**63, "more than the 100 MiB safetensors allows"),
        (b"{}", b"", MAX_HEADER + 1, "more than the 100 MiB safetensors allows"),  # not "the file has N" alone
        (b"not json", b"", None, "not JSON"),
        (b"[1, 2]", b"", None, "not a JSON object"),
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, None, "outside"),
        (
            {"w": {"dtype": "F32", "shape": [1 << 40, 1 << 40], "data_offsets": [0, 16]}},
            b"\0" * 16,
            None,
            "do not hold",
        ),
        ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, None, "malformed shape"),
        ({"w": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, None, "unsupported dtype"),
        ({"w": {"dtype": "F32", "shape": [1]}}, b"\0" * 4, None, "needs exactly"),
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            b"\0" * 12,
            None,
            "overlap",
        ),
        ({"__metadata__": {"k": 1}}, b"", None, "__metadata__"),
        (
            {"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}},
            b"\0" * 8,
            None,
            "cover 4 of the 8 bytes",
        ),  # a hole before it
        (
            {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
            b"\0" * 12,
            None,
            "cover 4 of the 12 bytes",
        ),  # bytes after it
        (
            b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], '
            b'"data_offsets": [4, 8]}}',
            b"\0" * 8,
            None,
            "appear more than once",
        ),
    ],
)
def test_hostile_headers_are_clear_errors(tmp_path, header, data, length, message):
    with pytest.raises(WeightsError, match=message):
        SafeTensors(_file(tmp_path, header, data, length))


def test_truncated_and_missing_files(tmp_path):
    (tmp_path / "short.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(WeightsError, match="8-byte header"):
        SafeTensors(tmp_path / "short.safetensors")
    with pytest.raises(WeightsError, match="not found"):
        SafeTensors(tmp_path / "nope.safetensors")


@pytest.mark.parametrize("alone", [False, True])
def test_a_tensor_past_the_address_space_limit_is_a_weights_error(tmp_path, alone):
    """Under `ulimit -v`, mapping a 1 GiB tensor fails with ENOMEM: a one-line WeightsError naming the limit, not
    an OSError that a load reports as "no artifact fits this device: OSError"."""
    import json
    import struct
    import subprocess
    import sys

    path = tmp_path / "big.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [1 << 28], "data_offsets": [0, 1 << 30]}}).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(header)) + header)
        handle.truncate(8 + len(header) + (1 << 30))  # sparse: no disk used
    code = (
        "import resource, sys\n"
        "from enginefarm.formats.safetensors_io import SafeTensors\n"
        "from enginefarm.errors import WeightsError\n"
        "st = SafeTensors(sys.argv[1])\n"
        "used = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
        "resource.setrlimit(resource.RLIMIT_AS, (used + (256 << 20), resource.RLIM_INFINITY))\n"
        "try:\n"
        f"    st.raw('w', alone={alone})\n"
        "except WeightsError as e:\n"
        "    print('WeightsError', e.message)\n"
        "except BaseException as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("WeightsError") and "address space" in out and "ulimit -v" in out, out
