"""Both backends reach the same server with the same inputs: ``storage_options`` in s3fs
style, the standard AWS variables, or a profile in the shared config files, exactly as
botocore reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fastdata.config import StoreConfig
from fastdata.errors import AccessDeniedError, ConfigError
from fastdata.store import ByteRange, Store
from fastdata.store._s3options import obstore_s3_settings, unsupported_options

CONFIG = StoreConfig(connect_timeout_s=3.0, request_timeout_s=7.0)


def _credentials(settings: Any) -> dict[str, Any]:
    return settings.kwargs["credential_provider"]()


def test_storage_options_are_translated_for_obstore(aws_env: None) -> None:
    settings = obstore_s3_settings(
        "bucket",
        "some/prefix",
        {
            "key": "AKIDEXAMPLE",
            "secret": "SECRETEXAMPLE",
            "token": "TOKENEXAMPLE",
            "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-3"},
            "config_kwargs": {"s3": {"addressing_style": "virtual"}},
            "requester_pays": True,
        },
        CONFIG,
    )
    kwargs = settings.kwargs
    assert kwargs["bucket"] == "bucket"
    assert kwargs["prefix"] == "some/prefix"
    assert kwargs["config"] == {
        "region": "eu-west-3",
        "endpoint": "http://127.0.0.1:9000",
        "virtual_hosted_style_request": True,
        "request_payer": True,
    }
    assert kwargs["client_options"]["allow_http"] is True
    assert kwargs["client_options"]["connect_timeout"].total_seconds() == 3.0
    assert kwargs["client_options"]["timeout"].total_seconds() == 7.0
    assert kwargs["retry_config"] == {"max_retries": 0}
    creds = _credentials(settings)
    assert (creds["access_key_id"], creds["secret_access_key"], creds["token"]) == (
        "AKIDEXAMPLE",
        "SECRETEXAMPLE",
        "TOKENEXAMPLE",
    )
    assert creds["expires_at"] is None
    assert set(settings.secrets) == {"AKIDEXAMPLE", "SECRETEXAMPLE", "TOKENEXAMPLE"}


def test_the_aws_variables_are_read_as_botocore_reads_them(
    aws_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9999")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDFROMENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "SECRETFROMENV")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    settings = obstore_s3_settings("bucket", "", {}, CONFIG)
    assert settings.kwargs["config"]["endpoint"] == "http://127.0.0.1:9999"
    assert settings.kwargs["config"]["region"] == "ap-south-1"
    assert "prefix" not in settings.kwargs
    assert _credentials(settings)["access_key_id"] == "AKIDFROMENV"
    # The service-specific variable wins over the global one, as in botocore.
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:8888")
    assert obstore_s3_settings("b", "", {}, CONFIG).kwargs["config"]["endpoint"] == (
        "http://127.0.0.1:8888"
    )


def test_a_profile_in_the_shared_files_gives_endpoint_region_and_keys(
    aws_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    config.write_text(
        "[profile lab]\nregion = eu-central-1\nendpoint_url = http://127.0.0.1:7777\n"
    )
    credentials = tmp_path / "credentials"
    credentials.write_text(
        "[lab]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = SECRETPROFILE\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    for options in ({"profile": "lab"}, {}):
        if not options:
            monkeypatch.setenv("AWS_PROFILE", "lab")
        settings = obstore_s3_settings("bucket", "", options, CONFIG)
        assert settings.kwargs["config"]["endpoint"] == "http://127.0.0.1:7777"
        assert settings.kwargs["config"]["region"] == "eu-central-1"
        assert _credentials(settings)["access_key_id"] == "AKIDPROFILE"


def test_aws_itself_gets_no_explicit_endpoint(aws_env: None) -> None:
    settings = obstore_s3_settings("bucket", "", {"anon": True}, CONFIG)
    assert "endpoint" not in settings.kwargs["config"]
    assert settings.kwargs["config"]["skip_signature"] is True
    assert "credential_provider" not in settings.kwargs
    assert settings.kwargs["client_options"]["allow_http"] is False


def test_no_credentials_anywhere_is_access_denied(aws_env: None, tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        with pytest.raises(AccessDeniedError, match="no AWS credentials"):
            obstore_s3_settings("bucket", "", {"endpoint_url": "http://127.0.0.1:1"}, CONFIG)


def test_half_a_key_pair_is_a_config_error(aws_env: None) -> None:
    with pytest.raises(ConfigError, match="key/secret"):
        obstore_s3_settings("bucket", "", {"key": "AKIDONLY"}, CONFIG)


def test_unsupported_options_are_named() -> None:
    assert unsupported_options({"key": "k", "client_kwargs": {"region_name": "x"}}) == []
    assert unsupported_options(
        {
            "session": object(),
            "version_aware": True,
            "client_kwargs": {"proxies": {}},
            "config_kwargs": {"s3": {"use_accelerate_endpoint": True}, "signature_version": "s3"},
        }
    ) == [
        "client_kwargs.proxies",
        "config_kwargs.s3.use_accelerate_endpoint",
        "config_kwargs.signature_version",
        "session",
        "version_aware",
    ]


@pytest.mark.parametrize("backend", ["obstore", "fsspec"])
def test_both_backends_reach_moto_from_the_aws_variables_alone(
    backend: str, moto_bucket: Any, aws_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = Store(moto_bucket.url, storage_options=moto_bucket.storage_options)
    seed.put_many([("env/a.bin", b"from the environment")])
    seed.close()
    for key, value in moto_bucket.env.items():
        monkeypatch.setenv(key, value)
    store = Store(moto_bucket.url, config=StoreConfig(backend=backend))  # type: ignore[arg-type]
    assert [i.path for i in store.list("env")] == ["env/a.bin"]
    (out,) = store.get_many([ByteRange("env/a.bin")])
    assert bytes(memoryview(out)) == b"from the environment"
    assert store.stats().backend == backend
    store.close()
