from __future__ import annotations

import json
import uuid

import pytest

from tests.servers import FaultProxy, MotoServer


@pytest.fixture(scope="session")
def moto_server():
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture
def s3_env(moto_server, monkeypatch):
    """boto3's standard configuration, pointed at the loopback moto server."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return moto_server


def make_bucket(endpoint: str) -> str:
    """A fresh bucket whose objects anyone may GET, like a public bucket behind a CDN."""
    import boto3

    name = f"ef-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket=name)
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{name}/*"}]}
    client.put_bucket_policy(Bucket=name, Policy=json.dumps(policy))
    return name


@pytest.fixture
def bucket(s3_env):
    return make_bucket(s3_env.url)


@pytest.fixture
def proxy(moto_server):
    proxy = FaultProxy(moto_server.port)
    yield proxy
    proxy.stop()
