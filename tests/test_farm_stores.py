"""The farm against real remote stores: build straight to S3, publish between stores, load over HTTP, gc."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import enginefarm
from enginefarm.cache.artifacts import read_index, read_manifest
from enginefarm.cache.stores import open_store
from tests import models
from tests.conftest import TINY_RECIPE, builds, make_bucket, run_cli, tiny_store_env

# What s3_env sets, for the module fixture that builds before any test's environment is set.
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
@builds
def farm_built(moto_server, tmp_path_factory) -> str:
    """The tiny model built by the real CLI straight to S3 (fp32 on both CPU backends), once: its bucket."""
    root = tmp_path_factory.mktemp("farm-s3")
    models.tiny_sd(root / "models" / "tiny_sd.onnx")
    recipe = root / "recipe.toml"
    recipe.write_text(TINY_RECIPE.format(precisions='["fp32"]', targets='["onnxruntime:cpu", "openvino:cpu"]'))
    (root / "store").mkdir()
    name = make_bucket(moto_server.url)
    env = {**tiny_store_env(root), **S3_ENV, "AWS_ENDPOINT_URL": moto_server.url}
    proc = run_cli("build", str(recipe), "--store", f"s3://{name}/farm", "-j", "2", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "2 built" in proc.stdout
    return name


@pytest.fixture
def farm_bucket(farm_built, bucket, s3_env):
    """The built farm copied object by object into this test's own bucket (the tests gc it, rebuild its index)."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env.url)  # credentials and region: s3_env's
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=farm_built, Prefix="farm/"):
        for item in page.get("Contents", []):
            client.copy_object(Bucket=bucket, Key=item["Key"], CopySource={"Bucket": farm_built, "Key": item["Key"]})
    return f"s3://{bucket}/farm"


def test_build_publishes_to_s3_and_skips_existing(farm_bucket, tiny_recipe, cli):
    store = open_store(farm_bucket)
    keys = set(store.list_manifest_keys())
    assert len(keys) == 2 and set(read_index(store, "tiny-sd").entries) == keys
    again = cli(
        "build",
        str(tiny_recipe(precisions=("fp32",), targets=("onnxruntime:cpu", "openvino:cpu"))),
        "--store",
        farm_bucket,
        check=True,
    )
    assert "0 built, 0 failed, 2 already stored" in again.stdout
    listing = json.loads(cli("ls", "--store", farm_bucket, "--json", check=True).stdout)
    assert {row["target"] for row in listing} == {"onnxruntime:cpu", "openvino:cpu"}


def test_app_loads_from_an_https_style_store_through_the_index(farm_bucket, bucket, s3_env, cli, tmp_path):
    http_url = f"{s3_env.url}/{bucket}/farm"
    session = enginefarm.load("tiny-sd/decoder", device="cpu", store=http_url)
    out = session.run({"latent": np.ones((1, 4, 8, 8), np.float32)})["sample"]
    assert out.shape == (1, 3, 16, 16)
    np.save(tmp_path / "latent.npy", np.ones((1, 4, 8, 8), np.float32))
    proc = cli("fetch", "tiny-sd/decoder", "--store", http_url, "--target", "openvino:cpu")
    assert proc.returncode == 0, proc.stderr
    assert "openvino:cpu fp32" in proc.stdout


def test_publish_copies_only_missing_blobs(tiny_recipe, cli, tmp_path, bucket, proxy, monkeypatch):
    local = tmp_path / "local-store"
    cli("build", str(tiny_recipe(precisions=("fp32", "fp16"))), "--store", str(local), "--no-bench", check=True)
    source = open_store(local)
    keys = list(source.list_manifest_keys())
    first = read_manifest(source, keys[0])
    # The destination already holds one of the blobs: publish must not send it again.
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    dest_url = f"s3://{bucket}/farm"
    dest = open_store(dest_url)
    shared = first.files[0].stored_sha256
    with source.open_blob(shared) as handle:
        (tmp_path / "shared").write_bytes(handle.read())
    dest.put_blob(shared, tmp_path / "shared")
    proxy.clear()
    proc = cli("publish", "--from", str(local), "--to", dest_url)
    assert proc.returncode == 0, proc.stderr
    assert "2 copied, 0 already" in proc.stdout
    # A blob the destination holds is refreshed (copied onto itself, so gc cannot delete it under the publish), never
    # sent.
    blob_puts = [
        path
        for method, path, headers in proxy.plan.log
        if method == "PUT" and "/blobs/" in path and not any(h.lower() == "x-amz-copy-source" for h in headers)
    ]
    assert len(blob_puts) == 1 and shared not in blob_puts[0]
    refreshed = [
        path
        for method, path, headers in proxy.plan.log
        if method == "PUT" and any(h.lower() == "x-amz-copy-source" for h in headers)
    ]
    assert len(refreshed) == 1 and shared in refreshed[0]
    assert set(read_index(dest, "tiny-sd").entries) == set(keys)
    again = cli("publish", "--from", str(local), "--to", dest_url, "--precision", "fp16", check=True)
    assert "0 copied, 1 already" in again.stdout
    nothing = cli("publish", "--from", str(local), "--to", dest_url, "--target", "openvino:gpu")
    assert nothing.returncode == 1 and nothing.stderr.startswith("error: nothing in")


def test_gc_is_a_dry_run_unless_asked(farm_bucket, cli, tmp_path):
    store = open_store(farm_bucket)
    (tmp_path / "orphan").write_bytes(b"nobody references me")
    import hashlib

    orphan = hashlib.sha256(b"nobody references me").hexdigest()
    store.put_blob(orphan, tmp_path / "orphan")
    young = cli("gc", "--store", farm_bucket, check=True)
    assert "0 unreferenced to delete" in young.stdout and "1 unreferenced but younger" in young.stdout
    dry = cli("gc", "--store", farm_bucket, "--grace", "0s", check=True)
    assert f"would delete blob {orphan}" in dry.stdout and store.has_blob(orphan)
    from enginefarm.cache.artifacts import CACHE_NEWEST_KEPT

    slot = "tensorrt-timing/sm_89/trt-10"
    for i in range(CACHE_NEWEST_KEPT + 1):
        store.put_cache_object(f"{slot}/{i:02d}", b"timing %d" % i)
    time.sleep(1.1)  # S3 keeps whole seconds: the grace below must see every object as older than it
    real = cli("gc", "--store", farm_bucket, "--grace", "1s", "--delete", check=True)
    assert f"deleted blob {orphan}" in real.stdout and not store.has_blob(orphan)
    assert "1 superseded build-cache objects deleted" in real.stdout
    assert len(store.list_cache_objects(slot)) == CACHE_NEWEST_KEPT
    for key in store.list_manifest_keys():
        assert all(store.has_blob(f.stored_sha256) for f in read_manifest(store, key).files)
    assert cli("gc", "--store", farm_bucket, "--grace", "soon").stderr.startswith("error: --grace 'soon'")


def test_index_rebuild_on_s3(farm_bucket, cli):
    store = open_store(farm_bucket)
    _, etag = store.get_index_bytes("tiny-sd")
    assert store.cas_index_bytes("tiny-sd", b"garbage", etag)
    assert read_index(store, "tiny-sd").entries == {}
    assert "tiny-sd: 2 artifacts" in cli("index", "--store", farm_bucket, check=True).stdout
    assert len(read_index(store, "tiny-sd").entries) == 2


def test_missing_bucket_is_one_line(farm_bucket, cli):
    proc = cli("ls", "--store", "s3://nosuchbucket-x/farm")
    assert proc.returncode == 1 and proc.stderr.startswith("error: bucket nosuchbucket-x does not exist")


def test_missing_credentials_say_what_to_set(s3_env, bucket, cli, tmp_path, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    env = {
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    proc = cli("ls", "--store", f"s3://{bucket}/farm", env=env)
    assert proc.returncode == 1 and proc.stderr.startswith(f"error: s3://{bucket}/farm: no AWS credentials found\n"), (
        proc.stderr
    )
    assert "hint: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in proc.stderr and "Traceback" not in proc.stderr
