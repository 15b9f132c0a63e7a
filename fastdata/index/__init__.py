"""The sample index: a URL plus a layout become an ordered, memory-mapped sample table.

:func:`open_index` lists the dataset once, lets the layout scan it (tar headers, Parquet
footers, packed footers; concurrently, through ``Store.get_many``) and saves the result
under ``<cache_dir>/index/<request key>/<source fingerprint>/`` as compact arrays
(``fastdata.layouts.table``). Later opens map those arrays: in ``validate`` mode (the
default) after one listing that is compared with the saved ETags and sizes, so added,
removed and overwritten objects are seen by the next open; in ``immutable`` mode with no
store request at all. A :class:`SampleIndex` answers the cache layer's questions
(``keys``, ``fingerprints``, ``read_samples``) batch by batch with numpy.

This module is the public face; the work is done by private modules, one job each:

- ``fastdata/index/_keys.py``: the saved index's key, the cache namespace, sample keys
  and fingerprints (NOTE[cache-keys]: what identifies a saved table and a cached record);
- ``fastdata/index/_sample_index.py``: :class:`SampleIndex` (an opened version) and
  :class:`IndexSource` (it bound to a store: what the cache reads);
- ``fastdata/index/_read.py``: fetch units (:func:`plan_units`) and sample reads;
- ``fastdata/index/_build.py``: listing, building and saving a version (:func:`save_index`);
- ``fastdata/index/_open.py``: :func:`open_index`, the ``validate`` / ``immutable``
  modes and :class:`DatasetChangedWarning`;
- ``fastdata/index/_manifest.py``: the manifest published beside the data
  (docs/manifest.md): its pointer, head and rows parts, written and read; a table opened
  from it fetches its rows lazily (NOTE[manifest-parts]);
- ``fastdata/index/_publish.py``: :func:`publish` (``fastdata publish``): every object
  read once for its CRC32Cs, resumable (NOTE[publish-resume]), then the manifest.

A published dataset opens with no listing: ``validate`` reads the manifest's pointer
(one request) and compares its generation; reads are pinned to the manifest's ETags and
every row's bytes are checked against its CRC32C (NOTE[manifest-verify] in
``fastdata/index/_read.py``).

Saving is atomic and safe between processes: NOTE[index-publish] in
``fastdata/layouts/table.py``. Seams for ``fastdata.tokens``, whose block index is a
second cache source over the same objects: :class:`BoundSource` (what every source over
an index shares) and :func:`mix` (the key hash of NOTE[cache-keys]).
"""

from __future__ import annotations

from fastdata.index._build import save_index
from fastdata.index._keys import dataset_id, mix, namespace_id, namespace_name
from fastdata.index._manifest import MANIFEST_DIR, POINTER_KEY
from fastdata.index._open import Consistency as Consistency
from fastdata.index._open import DatasetChangedWarning, StoreUnreachableWarning, open_index
from fastdata.index._publish import PublishProgress, PublishResult, publish
from fastdata.index._read import MAX_UNIT_BYTES as MAX_UNIT_BYTES
from fastdata.index._read import MERGE_GAP_BYTES as MERGE_GAP_BYTES
from fastdata.index._read import plan_units
from fastdata.index._sample_index import IndexSource, SampleIndex
from fastdata.index._source_base import BoundSource
from fastdata.store import normalize_url

__all__ = [
    "MANIFEST_DIR",
    "POINTER_KEY",
    "BoundSource",
    "DatasetChangedWarning",
    "IndexSource",
    "PublishProgress",
    "PublishResult",
    "SampleIndex",
    "StoreUnreachableWarning",
    "dataset_id",
    "normalize_url",
    "mix",
    "namespace_id",
    "namespace_name",
    "open_index",
    "plan_units",
    "publish",
    "save_index",
]
