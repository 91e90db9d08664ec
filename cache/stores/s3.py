"""A store in an S3 bucket (any S3-compatible endpoint: AWS, MinIO, R2, Ceph, moto).

Credentials and endpoint come from boto3's standard chain (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, profiles,
instance roles). Blobs and manifests are written with `If-None-Match: *`; the index with `If-Match`.
Servers whose conditional writes are not atomic (moto) are tolerated: content-addressed blobs are
identical whoever wins, any manifest of a key is valid, and index updates are re-read and re-merged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from enginefarm.errors import ArtifactNotFoundError, StoreError

from ..atomic import sha256_file
from .base import BlobReader, Store, blob_relpath, cache_folder, channel_relpath, check_cache_name, index_relpath
from .local import check_digest
from .ranged import Limits, Opened, ResumableReader, declared_total

log = logging.getLogger(__name__)

MULTIPART_THRESHOLD = 64 << 20
PART_SIZE = 16 << 20
COPY_LIMIT = 5 << 30  # CopyObject's limit; larger blobs are refreshed by a multipart copy
COPY_PART = 1 << 30


def _boto():
    try:
        import boto3
        import botocore
    except ImportError:
        raise StoreError("s3:// stores need boto3", hint="pip install 'enginefarm[s3]'") from None
    return boto3, botocore


class S3Store(Store):
    """A store in an S3 bucket, `s3://BUCKET[/PREFIX]`, on any S3-compatible endpoint (AWS_ENDPOINT_URL for MinIO,
    R2, Ceph). Large blobs go up in multipart uploads; `verify_uploads` (default ENGINEFARM_S3_VERIFY) reads each
    upload back."""

    def __init__(
        self,
        url: str,
        *,
        verify_uploads: bool | None = None,
        part_size: int = PART_SIZE,
        multipart_threshold: int = MULTIPART_THRESHOLD,
    ) -> None:
        rest = url[len("s3://") :]
        self.bucket, _, prefix = rest.partition("/")
        if not self.bucket:
            raise StoreError(f"{url}: no bucket", hint="write s3://BUCKET[/PREFIX]")
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.url = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        if verify_uploads is None:
            from enginefarm.settings import load_settings

            verify_uploads = load_settings().s3_verify
        self.verify_uploads = verify_uploads
        self.part_size = part_size
        self.multipart_threshold = multipart_threshold
        self._client = None

    # Plumbing --------------------------------------------------------------------------------------------
    @property
    def client(self):
        if self._client is None:
            boto3, botocore = _boto()
            from botocore.config import Config

            style = "path" if os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3") else "auto"
            config = Config(
                retries={"mode": "standard", "max_attempts": 10},
                s3={"addressing_style": style},
                connect_timeout=10,
                read_timeout=60,
                max_pool_connections=16,
            )
            client = boto3.session.Session().client("s3", config=config)
            try:
                client.head_bucket(Bucket=self.bucket)
            except botocore.exceptions.ClientError as exc:
                code, status = self._code(exc)
                if status == 404 or code in ("404", "NoSuchBucket"):
                    raise StoreError(
                        f"bucket {self.bucket} does not exist", hint="create it, or check AWS_ENDPOINT_URL"
                    ) from None
                # 403 here can still allow object access (narrow policies); the object calls will tell.
            except botocore.exceptions.BotoCoreError as exc:
                raise self._unreachable(exc) from None
            self._client = client
        return self._client

    def _key(self, rel: str) -> str:
        return self.prefix + rel

    def _code(self, exc) -> tuple[str, int]:
        response = getattr(exc, "response", {}) or {}
        return str(response.get("Error", {}).get("Code", "")), int(
            response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0
        )

    def _unreachable(self, exc) -> StoreError:
        _, botocore = _boto()
        if isinstance(exc, botocore.exceptions.NoCredentialsError):  # not a network problem: say what to set
            return StoreError(
                f"{self.url}: no AWS credentials found",
                hint="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE); for a public bucket use its "
                "https:// URL",
            )
        return StoreError(f"{self.url}: cannot reach the store: {exc}", hint="check AWS_ENDPOINT_URL and your network")

    def _fail(self, exc, what: str) -> StoreError:
        code, status = self._code(exc)
        if status == 403 or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return StoreError(
                f"{self.url}: access denied to {what} ({code})",
                hint="check AWS credentials / bucket policy",
                status=403,
            )
        if code == "NoSuchBucket":
            return StoreError(f"bucket {self.bucket} does not exist", hint="create it, or check AWS_ENDPOINT_URL")
        return StoreError(f"{self.url}: {what} failed: {code or type(exc).__name__} {exc}")

    def _head(self, rel: str) -> dict | None:
        _, botocore = _boto()
        try:
            return self.client.head_object(Bucket=self.bucket, Key=self._key(rel))
        except botocore.exceptions.ClientError as exc:
            code, status = self._code(exc)
            if status == 404 or code in ("404", "NoSuchKey", "NotFound"):
                return None
            raise self._fail(exc, f"HEAD {rel}") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise self._unreachable(exc) from None

    def _get(self, rel: str) -> tuple[bytes, str] | None:
        _, botocore = _boto()
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(rel))
            return response["Body"].read(), response.get("ETag")
        except botocore.exceptions.ClientError as exc:
            code, status = self._code(exc)
            if status == 404 or code in ("NoSuchKey", "404"):
                return None
            raise self._fail(exc, f"GET {rel}") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise self._unreachable(exc) from None

    def _put(self, rel: str, body, **conditions) -> bool:
        """PUT with conditions; False on 412 Precondition Failed or 409 conditional conflict."""
        _, botocore = _boto()
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(rel), Body=body, **conditions)
            return True
        except botocore.exceptions.ClientError as exc:
            code, status = self._code(exc)
            if status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise self._fail(exc, f"PUT {rel}") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise self._unreachable(exc) from None

    def _list(self, rel_prefix: str) -> Iterator[dict]:
        _, botocore = _boto()
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._key(rel_prefix)
            ):
                yield from page.get("Contents", [])
        except botocore.exceptions.ClientError as exc:
            raise self._fail(exc, f"LIST {rel_prefix}") from None

    # Blobs -----------------------------------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        return self._head(blob_relpath(check_digest(digest))) is not None

    def refresh_blob(self, digest: str) -> bool:
        """S3 cannot touch an object: it is copied onto itself (same bytes, a new LastModified). Objects over 5 GiB,
        which CopyObject refuses, are copied in 1 GiB parts."""
        rel = blob_relpath(check_digest(digest))
        head = self._head(rel)
        if head is None:
            return False
        _, botocore = _boto()
        key, source = self._key(rel), {"Bucket": self.bucket, "Key": self._key(rel)}
        try:
            if head["ContentLength"] <= COPY_LIMIT:
                self.client.copy_object(Bucket=self.bucket, Key=key, CopySource=source, MetadataDirective="REPLACE")
            else:
                self._copy_in_parts(key, source, head["ContentLength"])
        except botocore.exceptions.ClientError as exc:
            code, status = self._code(exc)
            if status == 404 or code in ("NoSuchKey", "404"):
                return False  # deleted under us: the caller uploads it again
            raise self._fail(exc, f"refresh {rel}") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise self._unreachable(exc) from None
        return True

    def _copy_in_parts(self, key: str, source: dict, size: int) -> None:
        upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        try:
            parts = []
            for number, start in enumerate(range(0, size, COPY_PART), 1):
                end = min(size, start + COPY_PART) - 1
                got = self.client.upload_part_copy(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload,
                    PartNumber=number,
                    CopySource=source,
                    CopySourceRange=f"bytes={start}-{end}",
                )
                parts.append({"ETag": got["CopyPartResult"]["ETag"], "PartNumber": number})
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            self._abort_quietly(key, upload)
            raise

    def _abort_quietly(self, key: str, upload: str) -> None:
        """Abandon a multipart upload while another error is on its way up: that error is the one to report."""
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)
        except Exception:
            pass

    def blob_mtime(self, digest: str) -> float | None:
        head = self._head(blob_relpath(check_digest(digest)))
        return None if head is None else head["LastModified"].timestamp()

    def put_blob(self, digest: str, path: Path, progress=None) -> bool:
        rel = blob_relpath(check_digest(digest))
        if self.refresh_blob(digest):  # reused: young again, so a concurrent gc keeps it (it may be an old orphan)
            return False
        size = path.stat().st_size
        if size >= self.multipart_threshold:
            written = self._multipart(rel, path, size, progress)
        else:
            with open(path, "rb") as body:
                written = self._put(rel, body, IfNoneMatch="*")
            if progress:
                progress(size)
        if self.verify_uploads:
            self._verify(rel, digest)
        return written

    def _multipart(self, rel: str, path: Path, size: int, progress) -> bool:
        """Parts are invisible until completion: a writer killed mid-way leaves no object (only parts that a
        bucket lifecycle rule for incomplete uploads reclaims)."""
        _, botocore = _boto()
        key = self._key(rel)
        upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        try:
            parts = []
            with open(path, "rb") as handle:
                number = 1
                while chunk := handle.read(self.part_size):
                    etag = self.client.upload_part(
                        Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=number, Body=chunk
                    )["ETag"]
                    parts.append({"ETag": etag, "PartNumber": number})
                    if progress:
                        progress(len(chunk))
                    number += 1
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}, IfNoneMatch="*"
            )
            return True
        except botocore.exceptions.ClientError as exc:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)
            code, status = self._code(exc)
            if status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False  # someone else stored this digest first: same bytes, success
            raise self._fail(exc, f"multipart upload of {rel}") from None
        except BaseException:
            self._abort_quietly(key, upload)
            raise

    def _verify(self, rel: str, digest: str) -> None:
        import tempfile

        with tempfile.NamedTemporaryFile() as tmp:
            with self.open_blob(digest) as src:
                while chunk := src.read(1 << 20):
                    tmp.write(chunk)
            tmp.flush()
            if sha256_file(Path(tmp.name)) != digest:
                raise StoreError(
                    f"{self.url}: read-back of {rel} does not match its digest",
                    hint="the store altered the object; check the bucket",
                )

    def open_blob(self, digest: str, size: int | None = None, offset: int = 0) -> BlobReader:
        rel = blob_relpath(check_digest(digest))
        _, botocore = _boto()
        import urllib3

        def opener(start: int, etag: str | None) -> Opened:
            args = {"Bucket": self.bucket, "Key": self._key(rel)}
            if start:
                args["Range"] = f"bytes={start}-"
            if etag:
                args["IfMatch"] = etag
            try:
                response = self.client.get_object(**args)
            except botocore.exceptions.ClientError as exc:
                code, status = self._code(exc)
                if status == 404 or code == "NoSuchKey":
                    raise ArtifactNotFoundError(f"blob {digest[:12]} is missing from {self.url}") from None
                if status in (412, 416) or code == "InvalidRange":  # the object changed under the transfer
                    from .ranged import BlobChanged

                    raise BlobChanged(f"blob {digest[:12]} changed during the transfer") from None
                raise self._fail(exc, f"GET {rel}") from None
            content_range = response.get("ContentRange") or ""
            first = int(content_range.split()[1].split("-")[0]) if content_range.startswith("bytes ") else 0
            total = declared_total(content_range, response.get("ContentLength"), first)
            return Opened(response["Body"], response.get("ETag"), first, bool(content_range), total)  # absolute offsets

        transient = (
            botocore.exceptions.ReadTimeoutError,
            botocore.exceptions.ConnectionError,
            botocore.exceptions.ResponseStreamingError,
            botocore.exceptions.IncompleteReadError,
            urllib3.exceptions.ProtocolError,
            urllib3.exceptions.ReadTimeoutError,
            ConnectionError,
            TimeoutError,
        )
        return ResumableReader(
            opener,
            expected_size=None if size is None else size - offset,
            transient=transient,
            limits=Limits(),
            what=f"blob {digest[:12]}",
            base=offset,
            object_size=size,
        )

    def delete_blob(self, digest: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(blob_relpath(check_digest(digest))))

    def list_partials(self) -> list[tuple[str, float]]:
        """Incomplete multipart uploads under this prefix (a builder killed mid-upload): their parts cost storage."""
        _, botocore = _boto()
        found = []
        try:
            for page in self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=self._key("blobs/")
            ):
                for upload in page.get("Uploads", []):
                    found.append((f"multipart:{upload['UploadId']}:{upload['Key']}", upload["Initiated"].timestamp()))
        except botocore.exceptions.ClientError as exc:
            raise self._fail(exc, "LIST multipart uploads") from None
        return sorted(found)

    def delete_partial(self, name: str) -> None:
        kind, _, rest = name.partition(":")
        upload, _, key = rest.partition(":")
        if kind == "multipart" and key.startswith(self._key("blobs/")):
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)

    def list_blobs(self) -> Iterator[tuple[str, float]]:
        for item in self._list("blobs/sha256/"):
            name = item["Key"].rsplit("/", 1)[-1]
            if len(name) == 64:
                yield name, item["LastModified"].timestamp()

    # Manifests -------------------------------------------------------------------------------------------
    def get_manifest_bytes(self, key: str) -> bytes | None:
        got = self._get(f"manifests/{check_digest(key)}.json")
        return None if got is None else got[0]

    def put_manifest_bytes(self, key: str, data: bytes) -> bool:
        return self._put(f"manifests/{check_digest(key)}.json", data, IfNoneMatch="*", ContentType="application/json")

    def open_manifest(self, key: str) -> BinaryIO:
        return self._open(f"manifests/{check_digest(key)}.json")

    def delete_manifest(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(f"manifests/{check_digest(key)}.json"))

    def _open(self, rel: str) -> BinaryIO:
        """A streaming GET: the reader decides how much of the body it takes."""
        _, botocore = _boto()
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(rel))["Body"]
        except botocore.exceptions.ClientError as exc:
            code, status = self._code(exc)
            if status == 404 or code in ("NoSuchKey", "404"):
                raise ArtifactNotFoundError(f"{rel} is missing from {self.url}") from None
            raise self._fail(exc, f"GET {rel}") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise self._unreachable(exc) from None

    def list_manifest_keys(self) -> Iterator[str]:
        for item in self._list("manifests/"):
            name = item["Key"].rsplit("/", 1)[-1]
            if name.endswith(".json") and len(name) == 69:
                yield name[:-5]

    # Index -----------------------------------------------------------------------------------------------
    def get_index_bytes(self, model: str) -> tuple[bytes | None, str | None]:
        got = self._get(index_relpath(model))
        return (None, None) if got is None else got

    def cas_index_bytes(self, model: str, data: bytes, etag: str | None) -> bool:
        conditions = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
        return self._put(
            index_relpath(model),
            data,
            ContentType="application/json",
            CacheControl="no-cache",
            **conditions,
        )

    def list_models(self) -> Iterator[str]:
        for item in self._list("index/"):
            name = item["Key"].rsplit("/", 1)[-1]
            if name.endswith(".json"):
                yield name[:-5]

    # Release channels ------------------------------------------------------------------------------------
    def open_channel_file(self, channel: str, name: str) -> BinaryIO:
        return self._open(channel_relpath(channel, name))

    def put_channel_file(self, channel: str, name: str, data: bytes) -> None:
        # Versioned files never change; timestamp.json and root.json do, so caches must revalidate them.
        self._put(channel_relpath(channel, name), data, ContentType="application/json", CacheControl="no-cache")

    # Shared build caches ---------------------------------------------------------------------------------
    def put_cache_object(self, name: str, data: bytes) -> bool:
        return self._put(f"caches/{check_cache_name(name)}", data, IfNoneMatch="*")

    def get_cache_object(self, name: str) -> bytes | None:
        got = self._get(f"caches/{check_cache_name(name)}")
        return None if got is None else got[0]

    def list_cache_entries(self, prefix: str) -> list[tuple[str, float]]:
        start = len(self._key("caches/"))
        return [
            (item["Key"][start:], item["LastModified"].timestamp())
            for item in self._list(f"caches/{cache_folder(prefix)}")
        ]

    def delete_cache_object(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(f"caches/{check_cache_name(name)}"))
