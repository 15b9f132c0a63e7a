"""What identifies a saved index, a cache namespace and a cached sample (NOTE[cache-keys]).

Plain functions without I/O; ``fastdata.index`` re-exports the public ones.

NOTE[cache-keys]: two identities, each derived here and nowhere else (docs/cache.md,
"Keys"). The *sample table* is saved under a key made of the whole spec (URL, layout,
pattern, fields, options) and the store's identity (``Store.identity``: scheme, resolved
endpoint or region, bucket), so two servers never share a saved index and every spec
keeps its own table. The *cached bytes* of a sample belong to the source object, not to
the spec that found it: an 8-byte namespace of the store alone (:func:`namespace_id`:
scheme, endpoint or region, bucket) and 8 bytes derived from the object's version (its
full name on the store, ``<dataset URL>/<path>``, its size and ETag:
``layouts.table.object_digest``), the sample's byte range, and the layout settings that
change the record (``Layout.record_options``). Any two specs over the same objects (a
warm of the bucket root and a loader on a prefix below it, a warm without labels and a
loader with labels, two overlapping patterns) therefore share their cached records,
and a changed object gets new keys. Each entry also carries a 16-byte fingerprint of the
same facts plus the store identity that the tiers compare on every read, so a key
collision is a miss, never wrong bytes; two servers never share an entry (their
namespaces and fingerprint salts differ). The namespace is what the cache tiers count
and evict by (``DatasetInfo`` of the LMDB tier); a spec's own 8-byte
:func:`dataset_id` (store identity and URL) names its saved index, its warm claims and
its row in ``fastdata stats``. A ``SampleIndex`` answers the cache layer's questions
(``keys``, ``fingerprints``, ``read_samples``) batch by batch with numpy, from the words
made here. Entries written under the earlier scheme (one namespace per dataset URL) are
never read again: they are misses, evicted as idle like any unused namespace.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from fastdata.layouts import Layout
from fastdata.layouts.files import callable_identity
from fastdata.layouts.table import object_name
from fastdata.store import ObjectInfo

__all__ = [
    "dataset_id",
    "key_words",
    "mix",
    "namespace_id",
    "namespace_name",
    "object_name",
    "source_fingerprint",
    "spec_key",
]

_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64 finaliser, vectorised (wraps modulo 2**64 by design)."""
    x = x + _MIX[0]
    x = (x ^ (x >> np.uint64(30))) * _MIX[1]
    x = (x ^ (x >> np.uint64(27))) * _MIX[2]
    return x ^ (x >> np.uint64(31))


def key_words(
    identity: str, layout: Layout
) -> tuple[npt.NDArray[np.uint64], tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]]:
    """The record-settings word of every key and the store-identity salt of every
    fingerprint (NOTE[cache-keys])."""
    recipe = json.dumps([layout.name, layout.record_options()], sort_keys=True)
    r = hashlib.blake2b(recipe.encode(), digest_size=8, person=b"fastdata-recipe").digest()
    salt = hashlib.blake2b(identity.encode(), digest_size=16, person=b"fastdata-store").digest()
    words = np.frombuffer(salt, dtype="<u8")
    return np.frombuffer(r, dtype="<u8")[:1], (words[:1], words[1:])


def spec_key(
    identity: str,
    url: str,
    layout: str | None,
    pattern: str | None,
    fields: Any,
    options: Mapping[str, Any],
) -> str:
    """The directory name of a spec's saved index versions (NOTE[cache-keys])."""
    spec = {
        "store": identity,
        "url": url,
        "layout": layout,
        "pattern": pattern,
        "fields": list(fields) if fields is not None else None,
        "options": dict(options),
    }
    text = json.dumps(spec, sort_keys=True, default=_stable_repr)
    return hashlib.blake2b(text.encode(), digest_size=12, person=b"fastdata-spec").hexdigest()


def _stable_repr(value: Any) -> str:
    """A JSON stand-in for an option value that JSON cannot hold: a callable (the files
    layout's ``label_from``) by its module, name and code, never by its address."""
    if callable(value):
        return callable_identity(value)
    return repr(value)


def namespace_name(identity: str) -> str:
    """How the record namespace of the store ``identity`` is registered and shown: the
    identity itself (``s3://bucket@http://host:port``)."""
    return identity


def namespace_id(identity: str) -> bytes:
    """The 8-byte record namespace of the store ``identity`` (scheme, endpoint or
    region, bucket): the first half of every key of its objects' records, whatever the
    spec that reads them (NOTE[cache-keys])."""
    text = json.dumps({"store": identity, "keys": "object"}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=8, person=b"fastdata-ns").digest()


def dataset_id(identity: str, url: str) -> bytes:
    """The 8-byte id of the dataset root ``url`` on the store ``identity``: it names the
    spec's saved index, warm claims and ``fastdata stats`` row, never cached bytes."""
    text = json.dumps({"store": identity, "url": url}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=8, person=b"fastdata-ns").digest()


def source_fingerprint(dataset_id: bytes, objects: Sequence[ObjectInfo]) -> str:
    """Digest of a listing (paths, sizes, ETags): an index version is saved under it."""
    digest = hashlib.blake2b(dataset_id, digest_size=16, person=b"fastdata-source")
    for info in objects:
        digest.update(
            f"{info.path}\0{info.size}\0{info.etag or ''}\n".encode("utf-8", "surrogateescape")
        )
    return digest.hexdigest()
