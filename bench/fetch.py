"""Fetch throughput: `enginefarm fetch` (GET + hash + decode + write into the cache) vs a bare GET of the same object.

A moto S3 server runs in its own process on loopback. One artifact is published to it: a synthetic fp16
weight file (--mib, 128 MiB by default), stored as efw1. Then, alternating, each repetition:
- bare:       one GET of each blob, bytes read and thrown away (boto3 for S3, urllib for HTTP);
- enginefarm: DeviceCache.fetch into an empty cache (resumable GET, efw1 decode, sha256, atomic write);
- for scale: GET + sha256 + write of the stored bytes on one thread (the least a verified download does).
All move the same stored bytes. Ratio = bare time / enginefarm time (throughput ratio; target >= 0.8).

    .venv/bin/python bench/fetch.py [--repeats 3] [--mib 128]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.servers import FaultProxy, MotoServer  # noqa: E402  (the same loopback servers the tests use)

TARGET = 0.8


def artifact_source(tmp: Path, mib: int) -> Path:
    """A folder with the files to publish."""
    folder = tmp / "artifact"
    folder.mkdir()
    weights = np.random.default_rng(0).standard_normal(mib << 19).astype(np.float16)  # mib MiB of fp16
    weights.tofile(folder / "model.bin")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mib", type=int, default=128, help="size of the synthetic weights")
    parser.add_argument(
        "--link-mibps", type=int, default=100, help="also measure through a proxy capped at this rate (0: skip)"
    )
    args = parser.parse_args()
    for name, value in {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ[name] = value
    server = MotoServer()
    os.environ["AWS_ENDPOINT_URL"] = server.url
    tmp = Path(tempfile.mkdtemp(prefix="enginefarm-bench-fetch-"))
    try:
        run(args, server, tmp)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def run(args, server: MotoServer, tmp: Path) -> None:
    import boto3

    from enginefarm.cache.artifacts import pack_files, publish
    from enginefarm.cache.device_cache import DeviceCache
    from enginefarm.cache.manifest import Manifest
    from enginefarm.cache.stores import open_store
    from tests.conftest import make_bucket

    bucket = make_bucket(server.url)
    folder = artifact_source(tmp, args.mib)
    files, blobs = pack_files(folder, [("model.bin", "weights")], tmp / "blobs")
    manifest = Manifest(
        build_key="b" * 64,
        model="bench",
        model_version="1",
        component="c",
        precision="fp16",
        profile_name="p",
        profile={},
        target="onnxruntime:cpu",
        toolchain={},
        files=tuple(files),
    )
    s3 = open_store(f"s3://{bucket}/farm")
    publish(s3, manifest, blobs)
    stored = sum(f.stored_size for f in files)
    raw = sum(f.size for f in files)
    http = open_store(f"{server.url}/{bucket}/farm")
    client = boto3.client("s3")
    print(
        f"object: {stored / 2**20:.1f} MiB stored ({files[0].codec}), {raw / 2**20:.1f} MiB raw; moto on "
        f"{server.url}; {args.repeats} repeats\n",
        flush=True,
    )

    def bare_s3() -> None:
        for f in files:
            body = client.get_object(Bucket=bucket, Key=f"farm/blobs/sha256/{f.stored_sha256[:2]}/{f.stored_sha256}")[
                "Body"
            ]
            while body.read(1 << 20):
                pass

    def bare_http() -> None:
        for f in files:
            with urllib.request.urlopen(
                f"{server.url}/{bucket}/farm/blobs/sha256/{f.stored_sha256[:2]}/{f.stored_sha256}"
            ) as response:
                while response.read(1 << 20):
                    pass

    def verified_http() -> None:
        """What any verified download costs at least: GET, sha256 and write the stored bytes, on one thread."""
        for f in files:
            digest = hashlib.sha256()
            with (
                urllib.request.urlopen(
                    f"{server.url}/{bucket}/farm/blobs/sha256/{f.stored_sha256[:2]}/{f.stored_sha256}"
                ) as response,
                open(tmp / "verified.bin", "wb") as out,
            ):
                while chunk := response.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
            assert digest.hexdigest() == f.stored_sha256

    def enginefarm_fetch(store):
        def go() -> None:
            home = tmp / "home"
            shutil.rmtree(home, ignore_errors=True)
            DeviceCache(home).fetch(store, manifest)

        return go

    from enginefarm.cache.stores.http import HttpStore

    parallel = HttpStore(http.url, workers=4)
    kinds = {
        "bare GET (boto3)": bare_s3,
        "enginefarm fetch (s3://)": enginefarm_fetch(s3),
        "bare GET (urllib)": bare_http,
        "enginefarm fetch (http://)": enginefarm_fetch(http),
        "GET + sha256 + write (urllib)": verified_http,
        "enginefarm fetch (http, 4 conns)": enginefarm_fetch(parallel),
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.repeats):
        for name, fn in kinds.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    print("loopback, uncapped: moto serves about 1 GiB/s, so this measures enginefarm's own ceiling on this CPU")
    # CPU time of this (client) process, all its threads: what a fetch costs wherever it runs. A link of R MiB/s
    # needs R x (CPU ms per MiB) / 1000 cores to keep up; moto's own CPU is in its own process, not counted.
    print(f"{'':34}{'median s':>10}{'MiB/s':>10}{'client CPU ms/MiB':>19}")
    median = {k: statistics.median(v) for k, v in times.items()}
    for name, seconds in median.items():
        cpu_ms_per_mib = statistics.median(cpu[name]) * 1e3 / (stored / 2**20)
        print(f"{name:34}{seconds:>10.2f}{stored / 2**20 / seconds:>10.1f}{cpu_ms_per_mib:>19.2f}")
    for scheme, bare, ours in (
        ("s3", "bare GET (boto3)", "enginefarm fetch (s3://)"),
        ("http", "bare GET (urllib)", "enginefarm fetch (http://)"),
        ("http, 4 connections", "bare GET (urllib)", "enginefarm fetch (http, 4 conns)"),
    ):
        paired = sorted(b / o for b, o in zip(times[bare], times[ours], strict=True))
        print(
            f"fetch throughput ratio, {scheme} (enginefarm / bare GET): {median[bare] / median[ours]:.2f} (target >= "
            f"{TARGET}; per repetition {paired[0]:.2f}..{paired[-1]:.2f})"
        )
    print(
        f"for scale, GET + sha256 + write of the stored bytes (no decoding) / bare GET: "
        f"{median['bare GET (urllib)'] / median['GET + sha256 + write (urllib)']:.2f}"
    )
    if args.link_mibps:
        link(args, server, bucket, files, manifest, stored, enginefarm_fetch)


def link(args, server, bucket, files, manifest, stored, enginefarm_fetch) -> None:
    """The same comparison over a rate-capped link (a proxy that trickles at --link-mibps), closer to a real
    download."""
    from enginefarm.cache.stores.http import HttpStore

    proxy = FaultProxy(server.port)
    proxy.add(path_contains="/blobs/", trickle_bps=args.link_mibps << 20, times=-1)
    capped = HttpStore(f"{proxy.url}/{bucket}/farm")

    def bare() -> None:
        for f in files:
            with urllib.request.urlopen(
                f"{proxy.url}/{bucket}/farm/blobs/sha256/{f.stored_sha256[:2]}/{f.stored_sha256}"
            ) as response:
                while response.read(1 << 20):
                    pass

    ours = enginefarm_fetch(capped)
    times = {"bare": [], "enginefarm": []}
    try:
        for _ in range(args.repeats):
            for name, fn in (("bare", bare), ("enginefarm", ours)):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    finally:
        proxy.stop()
    b, e = statistics.median(times["bare"]), statistics.median(times["enginefarm"])
    paired = sorted(x / y for x, y in zip(times["bare"], times["enginefarm"], strict=True))
    print(
        f"\nthrough a {args.link_mibps} MiB/s link: bare GET {stored / 2**20 / b:.0f} MiB/s, enginefarm fetch "
        f"{stored / 2**20 / e:.0f} MiB/s"
    )
    print(
        f"fetch throughput ratio over the capped link (enginefarm / bare GET): {b / e:.2f} (target >= {TARGET}; per "
        f"repetition {paired[0]:.2f}..{paired[-1]:.2f})"
    )


if __name__ == "__main__":
    main()
