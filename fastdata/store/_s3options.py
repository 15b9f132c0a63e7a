"""Translate s3fs-style ``storage_options`` (and the AWS environment) into obstore settings.

Both backends must reach the same server with the same credentials from the same inputs.
s3fs hands ``storage_options`` to botocore, which also reads the standard variables
(``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_S3``, ``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``,
``AWS_DEFAULT_REGION``...) and the shared config files. For obstore we do not re-implement
that chain: we ask botocore itself (a ``botocore.session.Session`` with the same profile)
for whatever ``storage_options`` leave open, and pass the answers to obstore explicitly,
credentials through a provider callable so that botocore's refreshing credentials
(assumed roles, instance metadata) keep working. Options obstore cannot honour are listed
by :func:`unsupported_options`; the store then uses fsspec instead (``backend="auto"``) or
refuses (``backend="obstore"``).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastdata.config import StoreConfig
from fastdata.errors import AccessDeniedError, ConfigError

if TYPE_CHECKING:
    import botocore.credentials
    import botocore.session

__all__ = [
    "ObstoreS3Settings",
    "obstore_s3_settings",
    "resolve_s3_endpoint",
    "unsupported_options",
]

#: Top-level s3fs options that obstore honours, or that only tune fsspec's own caches.
_TOP_LEVEL = frozenset(
    {
        "key",
        "secret",
        "token",
        "username",
        "password",
        "anon",
        "endpoint_url",
        "client_kwargs",
        "config_kwargs",
        "profile",
        "requester_pays",
        "use_ssl",
        "skip_instance_cache",
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "default_block_size",
        "default_fill_cache",
        "default_cache_type",
        "cache_regions",
        "max_concurrency",
        "fixed_upload_size",
    }
)
_CLIENT_KWARGS = frozenset(
    {
        "endpoint_url",
        "region_name",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "verify",
        "use_ssl",
    }
)
_CONFIG_KWARGS = frozenset(
    {
        "s3",
        "retries",
        "connect_timeout",
        "read_timeout",
        "max_pool_connections",
        "signature_version",
        "region_name",
    }
)
#: Refreshing credentials are asked again after this long (botocore refreshes as needed).
_REFRESH_S = 300


def unsupported_options(options: Mapping[str, Any]) -> list[str]:
    """The ``storage_options`` entries obstore cannot honour, as ``key`` or ``a.b`` paths."""
    bad = [k for k in options if k not in _TOP_LEVEL]
    if options.get("version_aware"):
        bad.append("version_aware")
    client = options.get("client_kwargs") or {}
    bad += [f"client_kwargs.{k}" for k in client if k not in _CLIENT_KWARGS]
    config = options.get("config_kwargs") or {}
    bad += [f"config_kwargs.{k}" for k in config if k not in _CONFIG_KWARGS]
    s3 = config.get("s3") or {}
    bad += [f"config_kwargs.s3.{k}" for k in s3 if k != "addressing_style"]
    if config.get("signature_version") not in (None, "s3v4"):
        bad.append("config_kwargs.signature_version")
    return sorted(set(bad))


@dataclass(frozen=True)
class ObstoreS3Settings:
    """Keyword arguments for ``obstore.store.S3Store`` and the values to redact."""

    kwargs: dict[str, Any]
    """``config``, ``client_options``, ``retry_config`` and ``credential_provider``."""
    secrets: tuple[str, ...]
    """Credential strings that must never appear in a message."""
    endpoint: str
    """The endpoint requests go to (for messages)."""


class _BotocoreCredentials:
    """An obstore credential provider backed by botocore's credential chain."""

    def __init__(self, credentials: botocore.credentials.Credentials, *, refreshing: bool) -> None:
        self._credentials = credentials
        self._refreshing = refreshing

    def __call__(self) -> dict[str, Any]:
        frozen = self._credentials.get_frozen_credentials()
        expires = (
            dt.datetime.now(dt.UTC) + dt.timedelta(seconds=_REFRESH_S) if self._refreshing else None
        )
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": expires,
        }


def obstore_s3_settings(
    bucket: str, prefix: str, options: Mapping[str, Any], config: StoreConfig
) -> ObstoreS3Settings:
    """Resolve ``options`` plus botocore's view of the environment into S3Store arguments.

    Raises:
        ConfigError: An option has a value obstore cannot use.
        AccessDeniedError: No credentials anywhere, and the bucket is not ``anon``.
    """
    import botocore.session

    client = dict(options.get("client_kwargs") or {})
    cfg = dict(options.get("config_kwargs") or {})
    session = botocore.session.Session(profile=options.get("profile"))
    endpoint, region = _endpoint_and_region(session, options)
    s3_config: dict[str, Any] = {"region": region}
    if endpoint:
        s3_config["endpoint"] = endpoint
    addressing = (cfg.get("s3") or {}).get("addressing_style")
    s3_config["virtual_hosted_style_request"] = addressing == "virtual"
    if options.get("requester_pays"):
        s3_config["request_payer"] = True
    client_options: dict[str, Any] = {
        "connect_timeout": dt.timedelta(seconds=config.connect_timeout_s),
        "timeout": dt.timedelta(seconds=config.request_timeout_s),
        "allow_http": bool(endpoint and endpoint.startswith("http://")),
    }
    if client.get("verify") is False:
        client_options["allow_invalid_certificates"] = True
    kwargs: dict[str, Any] = {
        "bucket": bucket,
        "config": s3_config,
        "client_options": client_options,
        "retry_config": {"max_retries": 0},  # NOTE[store-retry]: one policy retries
    }
    if prefix:
        kwargs["prefix"] = prefix
    secrets: tuple[str, ...] = ()
    if options.get("anon"):
        s3_config["skip_signature"] = True
    else:
        provider, secrets = _credentials(session, options, client, bucket)
        kwargs["credential_provider"] = provider
    return ObstoreS3Settings(kwargs, secrets, endpoint or f"AWS S3 ({region})")


def resolve_s3_endpoint(options: Mapping[str, Any]) -> tuple[str | None, str]:
    """``(endpoint, region)`` as botocore resolves them for ``options`` and the environment.

    ``endpoint`` is ``None`` for AWS S3 itself (then the region says where). The store's
    identity (``Store.identity``) is made of this answer, so two endpoints that serve the
    same bucket names never share cache entries.
    """
    client = options.get("client_kwargs") or {}
    explicit = options.get("endpoint_url") or client.get("endpoint_url")
    if explicit:
        return str(explicit), str(client.get("region_name") or "")
    # botocore's answer depends on the options, the AWS_* variables and the config files
    # it reads; a botocore session costs 0.5-2 s, so the answer is kept per process for
    # each set of inputs it can depend on (the files are assumed not to change).
    aws = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    return _resolved(json.dumps(dict(options), sort_keys=True, default=repr), aws)


@functools.lru_cache(maxsize=64)
def _resolved(options_json: str, aws: tuple[tuple[str, str], ...]) -> tuple[str | None, str]:
    import botocore.session

    options = json.loads(options_json)
    session = botocore.session.Session(profile=options.get("profile"))
    return _endpoint_and_region(session, options)


def _endpoint_and_region(
    session: botocore.session.Session, options: Mapping[str, Any]
) -> tuple[str | None, str]:
    client = dict(options.get("client_kwargs") or {})
    cfg = dict(options.get("config_kwargs") or {})
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    region = (
        client.get("region_name")
        or cfg.get("region_name")
        or session.get_config_variable("region")
        or "us-east-1"
    )
    if endpoint is None:
        # botocore's own resolution: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's
        # endpoint_url. Dummy credentials keep the probe from searching for real ones.
        probe = session.create_client(
            "s3",
            region_name=region,
            aws_access_key_id="probe",
            aws_secret_access_key="probe",
        )
        resolved = probe.meta.endpoint_url
        if "amazonaws.com" not in resolved:
            endpoint = resolved
    return endpoint, region


def _credentials(
    session: botocore.session.Session,
    options: Mapping[str, Any],
    client: Mapping[str, Any],
    bucket: str,
) -> tuple[_BotocoreCredentials, tuple[str, ...]]:
    import botocore.credentials

    key = options.get("key") or options.get("username") or client.get("aws_access_key_id")
    secret = options.get("secret") or options.get("password") or client.get("aws_secret_access_key")
    token = options.get("token") or client.get("aws_session_token")
    if bool(key) != bool(secret):
        raise ConfigError(
            f"storage_options for s3://{bucket} give only one of key/secret: give both, "
            "or neither to use the AWS environment"
        )
    if key and secret:
        creds = botocore.credentials.Credentials(key, secret, token)
        return _BotocoreCredentials(creds, refreshing=False), _secret_strings(key, secret, token)
    found = session.get_credentials()
    if found is None:
        raise AccessDeniedError(
            f"access denied to s3://{bucket}: no AWS credentials found; set storage_options "
            "key/secret, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or "
            "anon=True for a public bucket"
        )
    frozen = found.get_frozen_credentials()
    refreshing = isinstance(found, botocore.credentials.RefreshableCredentials)
    return (
        _BotocoreCredentials(found, refreshing=refreshing),
        _secret_strings(frozen.access_key, frozen.secret_key, frozen.token),
    )


def _secret_strings(*values: str | None) -> tuple[str, ...]:
    return tuple(v for v in values if v and len(v) >= 4)
