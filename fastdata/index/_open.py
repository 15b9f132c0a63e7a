"""Opening a sample index: which saved version to trust, and when to build a new one.

:func:`open_index` finds the saved versions of a spec (NOTE[cache-keys] in
``fastdata/index/_keys.py``), then in ``validate`` mode (the default) lists the dataset
once and compares it with the saved ETags and sizes, so added, removed and overwritten
objects are seen by the next open (reported by :class:`DatasetChangedWarning`, refused
with ``strict=True``); in ``immutable`` mode it trusts a saved version with no store
request at all. Builds run in ``fastdata/index/_build.py`` under the builders' lock, or
in a private temporary directory where the cache directory cannot be written.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fastdata._fork import current_pid, this_process
from fastdata.config import default_cache_dir
from fastdata.errors import (
    CacheError,
    ConfigError,
    FastdataError,
    ObjectChangedError,
    StoreUnavailableError,
)
from fastdata.index._build import Selection, build, is_current, select
from fastdata.index._keys import spec_key
from fastdata.index._manifest import POINTER_KEY, Pointer, materialize, read_pointer
from fastdata.index._sample_index import SampleIndex
from fastdata.layouts import make_layout
from fastdata.layouts.table import SampleTable, TableVersions
from fastdata.spec import Consistency, DatasetSpec
from fastdata.store import Store, normalize_url

__all__ = [
    "OFFLINE_PROBE_ATTEMPTS",
    "open_listed",
    "Consistency",
    "DatasetChangedWarning",
    "StoreUnreachableWarning",
    "open_index",
]

logger = logging.getLogger("fastdata.index")


class DatasetChangedWarning(UserWarning):
    """The dataset changed since its index was built (``consistency="validate"``)."""


class StoreUnreachableWarning(UserWarning):
    """A ``validate`` open could not reach the store and used the saved index instead
    (NOTE[offline-open])."""


OFFLINE_PROBE_ATTEMPTS = 3
"""Attempts of a ``validate`` open's listing when a saved index can stand in for it
(NOTE[offline-open])."""


@dataclass(frozen=True)
class _Request:
    """What the caller of :func:`open_index` asked for."""

    url: str
    store: Store
    layout: str | None
    pattern: str | None
    fields: Sequence[str] | None
    options: Mapping[str, Any]
    storage_options: Mapping[str, Any] | None

    def key(self) -> str:
        return spec_key(
            self.store.identity, self.url, self.layout, self.pattern, self.fields, self.options
        )

    def wrap(self, table: SampleTable | None) -> SampleIndex | None:
        """The saved version opened, or None when there is none or its scans are older
        than its layout's (NOTE[scan-version]: it is then built again, from scratch)."""
        if table is None:
            return None
        index = SampleIndex(table, storage_options=self.storage_options, store=self.store)
        if is_current(index):
            return index
        logger.info(
            "index %s of %s was saved by an older %s scan: scanning the objects again",
            table.directory,
            self.url,
            index.layout.name,
        )
        return None

    def select(self, *, max_attempts: int | None = None) -> Selection:
        """List the dataset and resolve its layout and pattern (:func:`select`)."""
        return select(
            self.store,
            self.url,
            self.layout,
            self.pattern,
            self.fields,
            self.options,
            max_attempts=max_attempts,
        )


def _report_changes(old: SampleIndex, new: Selection, strict: bool) -> None:
    listed = (old.object_info(i) for i in range(old.object_count))
    before = {info.path: info for info in listed}
    after = {info.path: info for info in new.objects}
    changed = [p for p, info in after.items() if p in before and before[p] != info]
    added = [p for p in after if p not in before]
    removed = [p for p in before if p not in after]
    examples = (changed + added + removed)[:5]
    message = (
        f"dataset {new.url} changed since its index was built: {len(changed)} object(s) "
        f"changed, {len(added)} added, {len(removed)} removed (e.g. {examples})."
    )
    if strict:
        raise ObjectChangedError(
            f"{message} Refusing because strict=True: restore the objects, or open with "
            "strict=False to index the new version"
        )
    message += (
        " Their samples are fetched again (cached copies no longer match), and sample ids "
        "may now point at other samples, so a resumed epoch is not the one interrupted. "
        "Pass strict=True to refuse instead."
    )
    logger.warning(message)
    warnings.warn(message, DatasetChangedWarning, stacklevel=3)


def open_index(
    spec: DatasetSpec | str | os.PathLike[str],
    *,
    store: Store | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    layout: str | None = None,
    pattern: str | None = None,
    fields: Sequence[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    consistency: Consistency = "validate",
    strict: bool = False,
    **layout_options: Any,
) -> SampleIndex:
    """Open the sample index of a dataset, building and saving it the first time.

    Args:
        spec: The dataset (:class:`~fastdata.spec.DatasetSpec`, what every entry point
            builds once and passes down), or its root URL (``s3://bucket/prefix``,
            ``file:///data``, a path), from which a spec is built with the keyword
            arguments below, which are the spec's fields and are refused beside a spec.
        store: An open store rooted at the dataset URL to use instead of a new one.
        cache_dir: Where indexes live (under ``index/``); default
            :func:`fastdata.config.default_cache_dir`.
        layout: ``files``, ``tar``, ``parquet`` or ``packed``; ``None`` detects it from
            the listing.
        pattern: Glob selecting objects below ``url`` (``**`` crosses folders); the
            default is the layout's (``**/*.tar``, ``**/*.parquet``, ``**/*.fdpack``,
            ``**`` for files).
        fields: Tar extensions or Parquet columns to keep; ``None`` keeps all.
        storage_options: Passed to the store untouched (credentials, endpoint).
        consistency: ``validate`` (the default) lists and compares sizes and ETags,
            rebuilding the index (only changed objects are scanned again) when they
            differ, so added, removed and overwritten objects are seen at once;
            ``immutable`` trusts a saved index without listing (for huge, frozen
            datasets: a changed object then fails its read with ``ObjectChangedError``
            rather than serve old bytes).
        strict: With ``validate``, refuse a changed dataset instead of warning.
        **layout_options: The layout's options: ``labels`` (files); ``decode_cls`` and
            ``on_truncated`` (tar).

    Returns:
        The opened index.

    Raises:
        ConfigError: A bad argument, nothing to index, or an ambiguous layout.
        ObjectChangedError: ``strict=True`` and the dataset changed.
        CorruptRecordError: A shard is malformed (names the object and offset).
        StoreError: The store failed.
    """
    return _open(
        spec,
        store=store,
        cache_dir=cache_dir,
        layout=layout,
        pattern=pattern,
        fields=fields,
        storage_options=storage_options,
        consistency=consistency,
        strict=strict,
        use_manifest=True,
        layout_options=layout_options,
    )


def open_listed(
    spec: DatasetSpec,
    *,
    store: Store | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> SampleIndex:
    """The index of ``spec`` from a listing of the store, never from its published
    manifest: what ``fastdata publish`` publishes (``validate`` whatever the spec says).
    A changed dataset is logged, not warned about: publishing it is the point."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DatasetChangedWarning)
        return _open(
            replace(spec, consistency="validate"),
            store=store,
            cache_dir=cache_dir,
            layout=None,
            pattern=None,
            fields=None,
            storage_options=None,
            consistency="validate",
            strict=False,
            use_manifest=False,
            layout_options={},
        )


def _open(
    spec: DatasetSpec | str | os.PathLike[str],
    *,
    store: Store | None,
    cache_dir: str | os.PathLike[str] | None,
    layout: str | None,
    pattern: str | None,
    fields: Sequence[str] | None,
    storage_options: Mapping[str, Any] | None,
    consistency: Consistency,
    strict: bool,
    use_manifest: bool,
    layout_options: Mapping[str, Any],
) -> SampleIndex:
    if isinstance(spec, DatasetSpec):
        given = {
            "layout": layout,
            "pattern": pattern,
            "fields": fields,
            "storage_options": storage_options,
            "strict": strict or None,
            **layout_options,
        }
        passed = sorted(k for k, v in given.items() if v is not None)
        if consistency != "validate":
            passed.append("consistency")
        if passed:
            raise ConfigError(
                f"open_index got a DatasetSpec and also {', '.join(passed)}: those are the "
                "spec's fields; set them on the spec (dataclasses.replace) instead"
            )
    else:
        spec = DatasetSpec(
            spec,  # type: ignore[arg-type]  # a PathLike: DatasetSpec normalizes it
            layout=layout,
            pattern=pattern,
            fields=fields,
            storage_options=storage_options or {},
            consistency=consistency,
            strict=strict,
            layout_options=layout_options,
        )
    url = spec.url
    fields = list(spec.fields) if spec.fields is not None else None
    if spec.layout is not None:
        make_layout(spec.layout, fields=fields, **spec.layout_options)
    if store is None:
        store = spec.store()
    elif normalize_url(store.url) != url:
        raise ConfigError(
            f"store is rooted at {store.url!r}, not at the dataset URL {url!r}; pass a store "
            "opened on the dataset URL, or none"
        )
    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    request = _Request(
        url,
        store,
        spec.layout,
        spec.pattern,
        fields,
        spec.layout_options,
        dict(spec.storage_options) or None,
    )
    strict = spec.strict
    consistency = spec.consistency
    versions = TableVersions(base / "index" / request.key())
    try:
        if consistency == "immutable":
            return _open_trusting(versions, request, use_manifest)
        return _open_validated(versions, request, strict, use_manifest)
    except FastdataError:
        raise
    except OSError as exc:
        # The store's errors are ours already: this is the index directory.
        raise CacheError(
            f"cannot save the index of {url} under {versions.root}: {exc}; free space there "
            "or point FASTDATA_CACHE_DIR (cache_dir=) at another directory"
        ) from exc


def _using(index: SampleIndex, how: str) -> SampleIndex:
    age_s = max(0.0, time.time() - index.built_at) if index.built_at else float("nan")
    logger.info(
        "%s: using the saved index %s (%s; built %.0f s ago; %d samples)",
        index.url,
        index.path,
        how,
        age_s,
        len(index),
    )
    return index


def _open_trusting(versions: TableVersions, request: _Request, use_manifest: bool) -> SampleIndex:
    found = request.wrap(versions.current())
    if found is not None:
        return _using(found, "consistency='immutable': not compared with the store")
    pointer = read_pointer(request.store) if use_manifest else None
    if pointer is not None and _fits(pointer, request):
        return _open_published(versions, request, pointer)
    with _writable(versions, request) as (target, writable):
        found = request.wrap(target.current()) if writable else None
        if found is not None:  # another process built it while we waited
            return _using(found, "built by another process")
        return SampleIndex(
            build(request.store, target, request.select(), None),
            storage_options=request.storage_options,
        )


def _fits(pointer: Pointer, request: _Request) -> bool:
    """Whether the published manifest is one of the spec asked for (its layout, pattern,
    fields and options, where the spec names them)."""
    spec = pointer.spec
    fits = (
        request.layout in (None, spec["layout"])
        and request.pattern in (None, spec["pattern"])
        and (request.fields is None or list(request.fields) == spec["fields"])
        and all(spec["layout_options"].get(k) == v for k, v in request.options.items())
    )
    if not fits:
        logger.info(
            "%s: its manifest was published for %s, not for this spec: listing the store",
            request.url,
            spec,
        )
    return fits


def _open_published(versions: TableVersions, request: _Request, pointer: Pointer) -> SampleIndex:
    """The local table of the manifest generation ``pointer`` names, fetched the first
    time (NOTE[manifest-parts] in ``fastdata/index/_manifest.py``)."""

    def same(index: SampleIndex | None) -> bool:
        return index is not None and index.generation == pointer.generation

    found = request.wrap(versions.current())
    if same(found):
        assert found is not None
        return _using(found, f"the manifest generation {pointer.generation} of the store")
    with _writable(versions, request) as (target, writable):
        if writable:
            found = request.wrap(target.current())
            if same(found):
                assert found is not None
                return _using(found, "fetched by another process")
        table = materialize(request.store, pointer, target)
        return SampleIndex(table, storage_options=request.storage_options, store=request.store)


def _open_validated(
    versions: TableVersions, request: _Request, strict: bool, use_manifest: bool = True
) -> SampleIndex:
    """NOTE[offline-open]: with a saved index to fall back on, the listing that validates
    it gets ``OFFLINE_PROBE_ATTEMPTS`` attempts, not the whole retry budget. A store that
    was never reached in them (refused, reset, DNS, connect timeouts:
    ``StoreUnavailableError`` with ``answered=False``) then opens the saved index at once
    with one warning naming its age, so cached samples are served while misses wait out
    the budget as usual; the next open validates again. A store that answered (5xx,
    throttling: the ranks of a job listing at once) is listed again with the whole
    budget, so that every rank validates the same way. Denied and missing buckets still
    raise. Without a saved index the listing has the whole budget, as before."""
    saved = request.wrap(versions.current())
    probe = OFFLINE_PROBE_ATTEMPTS if saved is not None else None
    if use_manifest and (saved is None or saved.generation is not None):
        # One GET: the published generation against the saved one (NOTE[manifest-parts]).
        # An index built from a listing sees a newly published manifest in its listing.
        try:
            pointer = read_pointer(request.store, max_attempts=probe)
        except StoreUnavailableError as exc:
            if saved is None:
                raise
            if not exc.answered:
                return _offline(saved, exc)
            pointer = read_pointer(request.store)  # answered: with the whole budget
        if pointer is not None and _fits(pointer, request):
            return _open_published(versions, request, pointer)
    try:
        selection = request.select(max_attempts=probe)
    except StoreUnavailableError as exc:
        if saved is None:
            raise
        if exc.answered:
            # The store is there, only failing or throttling (many ranks listing at
            # once): every rank must see the same index, so validate with the budget.
            selection = request.select()
        else:
            return _offline(saved, exc)
    if use_manifest and any(info.path == POINTER_KEY for info in selection.listing):
        pointer = read_pointer(request.store)
        if pointer is not None and _fits(pointer, request):
            return _open_published(versions, request, pointer)
    # A table opened from a manifest is never compared with a listing nor reused by a
    # build: its rows are fetched lazily from a generation that may be gone.
    found = saved if saved is None or saved.generation is None else None
    if found is not None and found.fingerprint == selection.fingerprint:
        return _using(found, "the listing matches it")
    with _writable(versions, request) as (target, writable):
        if writable:
            found = request.wrap(target.current())
            if found is not None and found.generation is not None:
                found = None
        if found is not None and found.fingerprint == selection.fingerprint:
            return _using(found, "the listing matches it")
        if found is not None:
            _report_changes(found, selection, strict)
        previous = found._table if found is not None else None
        table = build(request.store, target, selection, previous)
        return SampleIndex(table, storage_options=request.storage_options)


def _offline(saved: SampleIndex, exc: StoreUnavailableError) -> SampleIndex:
    age_s = max(0.0, time.time() - saved.built_at) if saved.built_at else float("nan")
    message = (
        f"{saved.url}: the store could not be reached ({exc.args[0].split('; last cause')[0]});"
        " using the saved index "
        f"{saved.path} built {age_s:.0f} s ago without comparing it with the store. Cached "
        "samples are served; misses wait for the store within its retry budget; the next "
        "open validates again"
    )
    logger.warning(message)
    warnings.warn(message, StoreUnreachableWarning, stacklevel=4)
    return saved


_warned_unwritable: set[str] = set()


@contextlib.contextmanager
def _writable(versions: TableVersions, request: _Request) -> Iterator[tuple[TableVersions, bool]]:
    """The saved versions with their builders' lock held, or, where the cache directory
    cannot be written (read-only, uncreatable), a private temporary directory with one
    warning: the index is then built there instead, rebuilt by every open, and removed
    when this process exits."""
    held = versions.lock()
    try:
        held.__enter__()
    except OSError as exc:
        reason = f"{type(exc).__name__}: {exc}"
    else:
        try:
            yield versions, True
        finally:
            held.__exit__(None, None, None)
        return
    where = str(versions.root.parent)
    if where not in _warned_unwritable:
        _warned_unwritable.add(where)
        message = (
            f"cannot save the index of {request.url} under {where} ({reason}); building it "
            "in a temporary directory instead, so every open lists and scans the dataset "
            "again. Point FASTDATA_CACHE_DIR (cache_dir=) at a writable directory"
        )
        logger.warning(message)
    scratch = Path(tempfile.mkdtemp(prefix="fastdata-index-"))
    # Removed when this process exits, not before: workers reopen the index by its path
    # (``SampleIndex.__reduce__``). A forked child inherits the list and skips it.
    _SCRATCH.append((scratch, current_pid()))
    try:
        (scratch / "index").mkdir()
        yield TableVersions(scratch / "index"), False
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)  # no index came of it: nothing reads it
        raise


_SCRATCH: list[tuple[Path, int]] = []
"""Temporary index directories and the process that made each (see ``_writable``)."""


@atexit.register
def _remove_scratch() -> None:
    for scratch, owner in _SCRATCH:
        if this_process(owner):
            shutil.rmtree(scratch, ignore_errors=True)
