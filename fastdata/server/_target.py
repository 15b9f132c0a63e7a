"""How a client reaches an S3-compatible test server: one bucket (and prefix) on it.

:class:`S3Target` is the one place that says what each kind of client needs (fsspec's
``storage_options``, the standard ``AWS_*`` variables for subprocesses and obstore,
a boto3 client), so the fixtures in tests/conftest.py, :class:`SeaweedServer` and the
benchmark cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ACCESS_KEY", "REGION", "SECRET_KEY", "S3Target"]

ACCESS_KEY = "fastdata"
"""The access key the embedded test servers accept (SeaweedFS without an identity
config accepts any)."""
SECRET_KEY = "fastdata-secret"
"""The secret key the embedded test servers accept."""
REGION = "us-east-1"
"""The region every test client names (the servers ignore it; clients require one)."""


@dataclass(frozen=True)
class S3Target:
    """One bucket (and optional prefix) on an S3-compatible server.

    Args:
        endpoint_url: ``http://host:port`` of the S3 API.
        bucket: The bucket name (empty: the server itself, for ``env`` and clients).
        prefix: A folder inside the bucket, without slashes at its ends.
    """

    endpoint_url: str
    bucket: str = ""
    prefix: str = ""

    @property
    def url(self) -> str:
        """``s3://bucket`` or ``s3://bucket/prefix``."""
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs ``storage_options`` (fastdata's ``Store`` takes the same)."""
        return {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": REGION},
        }

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS variables that point boto-style clients (and a ``fastdata``
        subprocess) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
        }

    def boto3_client(self) -> Any:
        """A boto3 S3 client for this server (needs ``boto3``, a test dependency)."""
        import boto3  # type: ignore[import-untyped]  # a test dependency

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )
