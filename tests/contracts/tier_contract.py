"""The tier contract and the cache tests' fakes: shipped as ``fastdata.testing.tier_contract``
(so a third-party tier can prove itself), imported from there for fastdata's own tests."""

from fastdata.testing.tier_contract import (
    DATASET,
    OTHER,
    FakeSource,
    TierContract,
    corrupt_record,
    fingerprint,
    item,
    make_record,
    payload,
    read_all,
)

__all__ = [
    "DATASET",
    "OTHER",
    "FakeSource",
    "TierContract",
    "corrupt_record",
    "fingerprint",
    "item",
    "make_record",
    "payload",
    "read_all",
]
