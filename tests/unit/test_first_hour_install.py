"""boto3 beside fastdata (issue 20, item 9): ``pip install boto3`` in a fastdata
environment pulled a botocore newer than aiobotocore accepts, and s3fs then failed.

fastdata depends on boto3 itself, so pip resolves boto3, botocore and aiobotocore
together at install time and a later ``pip install boto3`` finds it already satisfied.
CI proves the install itself (.ci/run: ``pip install boto3``, ``pip check``, both
clients in one process); these tests hold the declaration and the installed set.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.version import Version

from fastdata.testing.s3 import S3Target

ROOT = Path(__file__).resolve().parents[2]


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def test_boto3_is_a_dependency_and_no_extra_asks_for_a_missing_one() -> None:
    project = _project()
    assert "boto3" in {Requirement(r).name for r in project["dependencies"]}
    for extra, requirements in project["optional-dependencies"].items():
        for requirement in map(Requirement, requirements):
            # s3fs 2026.9 has no extras at all ("s3fs[boto3]" only made pip warn).
            assert not (requirement.name == "s3fs" and requirement.extras), extra


def test_the_declared_boto3_range_lies_in_aiobotocores_botocore_range() -> None:
    (boto3,) = [r for r in map(Requirement, _project()["dependencies"]) if r.name == "boto3"]
    bounds = {spec.operator: Version(spec.version) for spec in boto3.specifier}
    assert set(bounds) == {">=", "<"}, boto3  # boto3 X.Y.Z needs botocore X.Y.Z
    (botocore,) = _botocore_wanted_by("aiobotocore")
    assert bounds[">="] in botocore.specifier
    upper = [Version(s.version) for s in botocore.specifier if s.operator in ("<", "<=")]
    assert upper, botocore
    assert all(bounds["<"] <= u for u in upper), (boto3, botocore)


def _botocore_wanted_by(package: str) -> list[Requirement]:
    return [
        Requirement(r)
        for r in importlib.metadata.requires(package) or []
        if Requirement(r).name == "botocore" and Requirement(r).marker is None
    ]


def test_the_installed_botocore_is_one_aiobotocore_and_boto3_both_accept() -> None:
    botocore = importlib.metadata.version("botocore")
    for package in ("aiobotocore", "boto3"):
        wanted = _botocore_wanted_by(package)
        assert wanted, package
        assert all(r.specifier.contains(botocore) for r in wanted), (package, botocore, wanted)


def test_s3fs_and_boto3_read_each_others_objects(moto_bucket: S3Target, aws_env: None) -> None:
    import s3fs

    client = moto_bucket.boto3_client()
    client.put_object(Bucket=moto_bucket.bucket, Key="a.bin", Body=b"written by boto3")
    fs = s3fs.S3FileSystem(**moto_bucket.storage_options)
    assert fs.cat(f"{moto_bucket.bucket}/a.bin") == b"written by boto3"
    fs.pipe(f"{moto_bucket.bucket}/b.bin", b"written by s3fs")
    body = client.get_object(Bucket=moto_bucket.bucket, Key="b.bin")["Body"].read()
    assert body == b"written by s3fs"
