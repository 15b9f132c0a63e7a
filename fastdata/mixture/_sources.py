"""What a mixture accepts as sources: datasets of one kind whose batches are alike
(the same fields and kinds, or the same token block length and dtype), and one
``on_error`` policy; every refusal names the source and the difference."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastdata.dataset import BaseDataset, Dataset, OnError, check_on_error
from fastdata.errors import ConfigError
from fastdata.tokens import TokenDataset

Source = Dataset | TokenDataset
"""What a mixture blends: datasets of samples, or token corpora (siblings, not one class)."""

__all__ = ["Source", "check_policy", "check_sources"]


def _signature(ds: Source) -> dict[str, str]:
    """What a source's batches hold: field name -> kind (metadata names as ``meta``)."""
    kinds = dict(ds.field_kinds)
    if ds.fields is not None:
        kinds = {k: v for k, v in kinds.items() if k in ds.fields}
    for name in getattr(ds, "metadata", ()):
        kinds[name] = "meta"
    return kinds


def check_sources(sources: Any) -> tuple[Source, ...]:
    if isinstance(sources, str | bytes | BaseDataset) or not isinstance(sources, Sequence):
        raise ConfigError(
            f"sources must be a sequence of fastdata.Dataset or TokenDataset, got {sources!r}"
        )
    if not sources:
        raise ConfigError("sources must hold at least one dataset")
    for i, s in enumerate(sources):
        if not isinstance(s, Dataset | TokenDataset):
            raise ConfigError(
                f"sources[{i}] must be a fastdata.Dataset or fastdata.TokenDataset, got "
                f"{type(s).__name__}"
            )
    first = sources[0]
    tokens = isinstance(first, TokenDataset)
    for i, s in enumerate(sources[1:], start=1):
        if isinstance(s, TokenDataset) != tokens:
            raise ConfigError(
                f"sources[0] is a {type(first).__name__} and sources[{i}] a "
                f"{type(s).__name__}: a mixture blends datasets of one kind"
            )
        if tokens:
            _check_tokens(first, s, i)
        else:
            _check_fields(first, s, i)
        if (s.transform is None) != (first.transform is None):
            raise ConfigError(
                f"sources[0] {'has' if first.transform else 'has no'} transform and "
                f"sources[{i}] {'has' if s.transform else 'has no'}: give every source a "
                "transform (they may differ) or none, so that every batch is alike"
            )
    return tuple(sources)


def _check_tokens(first: TokenDataset, other: TokenDataset, i: int) -> None:
    a, b = first.blocks, other.blocks
    if (a.block_size, a.length) != (b.block_size, b.length):
        raise ConfigError(
            f"sources[{i}] ({b.url}) has blocks of {b.block_size} tokens (length {b.length}) "
            f"but sources[0] ({a.url}) of {a.block_size} (length {a.length}): give every "
            "TokenDataset the same block_size and targets"
        )
    if first.out_dtype != other.out_dtype:
        raise ConfigError(
            f"sources[{i}] delivers {other.out_dtype} tokens and sources[0] {first.out_dtype}: "
            "give every TokenDataset the same out_dtype"
        )


def _check_fields(first: Source, other: Source, i: int) -> None:
    mine, theirs = _signature(first), _signature(other)
    if mine == theirs:
        return
    missing = sorted(set(mine) - set(theirs))
    extra = sorted(set(theirs) - set(mine))
    kinds = sorted(k for k in set(mine) & set(theirs) if mine[k] != theirs[k])
    parts = []
    if missing:
        parts.append(f"lacks {missing}")
    if extra:
        parts.append(f"has {extra} besides")
    if kinds:
        parts.append(
            "has other kinds for " + ", ".join(f"{k!r} ({theirs[k]} vs {mine[k]})" for k in kinds)
        )
    raise ConfigError(
        f"sources[{i}] ({other.index.url}) {'; '.join(parts)} compared with sources[0] "
        f"({first.index.url}): select the same fields in every source (fields=, "
        "metadata=, layout_options such as labels=)"
    )


def check_policy(sources: Sequence[Source], on_error: OnError | None) -> OnError:
    if on_error is not None:
        return check_on_error(on_error)
    policies = {s.on_error for s in sources}
    if len(policies) > 1:
        raise ConfigError(
            f"the sources disagree on on_error ({sorted(policies)}): pass on_error= to the "
            "Mixture, which applies it to every source"
        )
    return next(iter(policies))
