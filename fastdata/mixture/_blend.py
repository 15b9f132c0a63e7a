"""The blend rule of a mixture: how many samples of each source each rank's batch takes.

Pure integer arithmetic over numpy arrays, no torch, no I/O (NOTE[blend-rule]).

NOTE[blend-rule]: weights are fractions ``p_d / Q`` (:class:`BlendWeights`). A blend
*segment* starts with every count at zero. After global step ``k`` rank ``r`` has read
``n_r`` samples of the segment (``k * batch_size``, plus its share of a tail step), and
its counts ``R[r, d]`` satisfy, for every source ``d``,

* per rank: ``|R[r, d] - w_d * n_r| <= 1``, and ``R[r, d]`` is ``floor(w_d * n_r)`` or
  one more;
* in total: ``|sum_r R[r, d] - w_d * sum_r n_r| <= 1``;
* counts only grow, and every rank's row adds up to ``n_r``.

Each step picks the next counts from the previous ones: every source gets its floor on
every rank; the sources whose floor already lies below the rank's count keep their
extra sample (*forced*); the remaining extras (``n_r - sum_d floor``) are handed out as a
0/1 matrix whose column sums keep the totals within one. That matrix is found greedily
(column quotas by the largest remainders of the exact totals; ranks with the most
extras left first, then the rank furthest below its target, then a low-discrepancy
rank order) and, where the greedy ends short, by augmenting paths, so a matrix is
found whenever one exists. Two and three sources never met a full step without one
(tests/property/test_mixture_blend.py: world sizes 1-16, batch sizes 1-33, random
weights, 5,000 examples); an epoch's last, shorter step rarely can, and with four or
more sources about one run of 80 steps in 25 meets one. Such a step relaxes the total
(logged); the per-rank bound is kept, except in the last resort of balancing each rank
alone.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from fastdata.errors import ConfigError

__all__ = ["MAX_DENOMINATOR", "BlendWeights", "blend_step", "walk_segment"]

logger = logging.getLogger("fastdata.mixture")

MAX_DENOMINATOR = 1 << 20
"""Weights are the nearest fractions with denominators up to this (NOTE[blend-rule])."""
_MAX_Q = 1 << 24
"""A common denominator above this is rounded down to it (largest remainder)."""


@dataclass(frozen=True)
class BlendWeights:
    """Normalised weights as integers: source ``d`` has weight ``numerators[d] / denominator``.

    Raises:
        ConfigError: Not a sequence of non-negative finite numbers with a positive sum.
    """

    numerators: tuple[int, ...]
    """One per source; they add up to :attr:`denominator`."""
    denominator: int
    """The common denominator ``Q``."""

    @classmethod
    def of(cls, weights: Sequence[float], count: int) -> BlendWeights:
        """The blend weights of ``weights`` (any positive scale: ``[7, 2, 1]`` or
        ``[0.7, 0.2, 0.1]``) for ``count`` sources."""
        if isinstance(weights, str | bytes) or not isinstance(weights, Sequence):
            raise ConfigError(f"weights must be a sequence of numbers, got {weights!r}")
        if len(weights) != count:
            raise ConfigError(
                f"weights has {len(weights)} entries for {count} sources: give one weight "
                "per source, in the order of sources"
            )
        values: list[Fraction] = []
        for i, w in enumerate(weights):
            if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w):
                raise ConfigError(f"weights[{i}] must be a finite number, got {w!r}")
            if w < 0:
                raise ConfigError(f"weights[{i}] must not be negative, got {w!r}")
            values.append(Fraction(w))
        total = sum(values, Fraction(0))
        if total <= 0:
            raise ConfigError(f"weights must have a positive sum, got {list(weights)!r}")
        fractions = [(v / total).limit_denominator(MAX_DENOMINATOR) for v in values]
        q = math.lcm(*(f.denominator for f in fractions))
        if q > _MAX_Q or sum(fractions) != 1:
            q = _MAX_Q
            exact = [v / total * q for v in values]
            nums = [math.floor(x) for x in exact]
            order = sorted(range(count), key=lambda d: -(exact[d] - nums[d]))
            for d in order[: q - sum(nums)]:
                nums[d] += 1
            return cls(tuple(nums), q)
        return cls(tuple(int(f * q) for f in fractions), q)

    @property
    def floats(self) -> tuple[float, ...]:
        """The weights as floats (what ``Mixture.weights`` shows)."""
        return tuple(p / self.denominator for p in self.numerators)


def blend_step(counts: np.ndarray, totals: np.ndarray, weights: BlendWeights) -> np.ndarray:
    """The counts after the next step of a segment (NOTE[blend-rule]).

    Args:
        counts: ``[W, D]`` int64, each rank's samples per source so far in the segment.
        totals: ``[W]`` int64, each rank's samples in the segment after this step (each
            at least its row sum in ``counts``).
        weights: The segment's weights.

    Returns:
        ``[W, D]`` int64 counts after the step: at least ``counts``, rows adding up to
        ``totals``.
    """
    p = np.asarray(weights.numerators, dtype=np.int64)
    q = weights.denominator
    scaled = totals[:, None] * p[None, :]  # targets times q, exact
    floor = scaled // q
    frac = scaled - floor * q
    extras = totals - floor.sum(axis=1)
    forced = counts > floor
    need = extras - forced.sum(axis=1)
    column = scaled.sum(axis=0)  # total targets times q
    base = floor.sum(axis=0) + forced.sum(axis=0)
    # An extra whose floor will not have risen by the next step of this size is forced
    # there too: spread those over the ranks (a rank with more forced extras than the
    # next step's extras has no valid next step).
    step = (totals - counts.sum(axis=1))[:, None]
    sticky = ((totals[:, None] + step) * p[None, :]) // q == floor
    if (need >= 0).all():
        for slack in range(1, counts.shape[0] + 2):
            low = np.maximum(_ceil_div(column - slack * q, q) - base, 0)
            high = _floor_div(column + slack * q, q) - base
            allowed = ~forced & (frac > 0)
            picked = _extras(
                allowed,
                need,
                low,
                high,
                scaled - counts * q,
                forced,
                sticky,
                (column - q * base, q),
            )
            if picked is not None:
                if slack > 1:
                    logger.warning(
                        "mixture blend: no step keeps every source's total within one "
                        "sample here; this step keeps it within %d (NOTE[blend-rule])",
                        slack,
                    )
                return np.asarray(floor + (forced | picked), dtype=np.int64)
    return _per_rank(counts, totals, p, q)


def _ceil_div(a: np.ndarray, b: int) -> np.ndarray:
    return np.asarray(-((-a) // b), dtype=np.int64)


def _floor_div(a: np.ndarray, b: int) -> np.ndarray:
    return np.asarray(a // b, dtype=np.int64)


def _extras(
    allowed: np.ndarray,
    need: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    deficit: np.ndarray,
    forced: np.ndarray,
    sticky: np.ndarray,
    target: tuple[np.ndarray, int],
) -> np.ndarray | None:
    """A 0/1 matrix over ``allowed`` cells with row sums ``need`` and column sums in
    ``[low, high]``, or ``None`` where none exists. Ranks with more extras left come
    first (so the greedy fills every row when it can), then, for an extra that stays
    forced (``sticky``), ranks with fewer such extras, then the largest ``deficit``."""
    high = np.minimum(high, allowed.sum(axis=0))
    if (low > high).any() or int(low.sum()) > int(need.sum()) or int(high.sum()) < int(need.sum()):
        return None
    picked = np.zeros(allowed.shape, dtype=bool)
    left = need.copy()
    load = (forced & sticky).sum(axis=1)
    extra_target, q = target
    quota = _quotas(extra_target, q, low, high, int(need.sum()))
    # Last tie-break: the ranks dealt round-robin in a low-discrepancy order, so every
    # prefix of ranks gets its share of each source's extras (the ranks of a plan's
    # tail step are a prefix: a lowest-index-first tie-break put one source's extras
    # on exactly the ranks that then took no tail sample).
    position = _spread_positions(allowed.shape[0])
    dealt = 0
    for d in np.argsort(-quota, kind="stable").tolist():
        cand = np.flatnonzero(allowed[:, d] & (left > 0))
        spread = load[cand] * sticky[cand, d]
        turn = (position[cand] - dealt) % allowed.shape[0]
        order = np.lexsort((turn, -deficit[cand, d], spread, -left[cand]))
        chosen = cand[order[: int(quota[d])]]
        picked[chosen, d] = True
        left[chosen] -= 1
        load[chosen] += sticky[chosen, d]
        dealt += len(chosen)
    if not left.any():
        return picked
    return _augment(allowed, picked, left, low, high)


def _quotas(
    target: np.ndarray, q: int, low: np.ndarray, high: np.ndarray, total: int
) -> np.ndarray:
    """Extras per column adding up to ``total``, within ``[low, high]``, as near their
    exact targets ``target / q`` as the bounds allow (largest remainders): the totals
    keep the most room for the steps after."""
    quota = np.clip(target // q, low, high)
    remainder = target - quota * q
    while int(quota.sum()) < total:
        room = np.flatnonzero(quota < high)
        d = int(room[np.argmax(remainder[room])])
        quota[d] += 1
        remainder[d] -= q
    while int(quota.sum()) > total:
        room = np.flatnonzero(quota > low)
        d = int(room[np.argmin(remainder[room])])
        quota[d] -= 1
        remainder[d] += q
    return np.asarray(quota, dtype=np.int64)


@functools.cache
def _spread_positions(ranks: int) -> np.ndarray:
    """Each rank's turn in a low-discrepancy order of ``ranks`` (bit-reversed indices):
    every run of consecutive turns covers the ranks evenly."""
    bits = max(1, (ranks - 1).bit_length())
    keys = [int(f"{r:0{bits}b}"[::-1], 2) for r in range(ranks)]
    order = sorted(range(ranks), key=lambda r: keys[r])
    position = np.empty(ranks, dtype=np.int64)
    position[order] = np.arange(ranks)
    return position


def _augment(
    allowed: np.ndarray, picked: np.ndarray, left: np.ndarray, low: np.ndarray, high: np.ndarray
) -> np.ndarray | None:
    """Complete ``picked`` by augmenting paths, each giving one more extra to a column
    below its bound and to a rank with ``left > 0``; ``None`` when no path is left."""
    while left.any():
        sums = picked.sum(axis=0)
        below = np.flatnonzero(sums < low).tolist()
        room = np.flatnonzero((sums >= low) & (sums < high)).tolist()
        for start in below + room:
            path = _find_path(allowed, picked, left, start)
            if path is not None:
                break
        else:
            return None
        for r, d, value in path:
            picked[r, d] = value
        left[path[0][0]] -= 1  # the rank the path ends at (found first)
    sums = picked.sum(axis=0)
    return picked if bool((sums >= low).all() and (sums <= high).all()) else None


def _find_path(
    allowed: np.ndarray, picked: np.ndarray, left: np.ndarray, start: int
) -> list[tuple[int, int, bool]] | None:
    """Breadth-first from column ``start``: column ``d`` to a rank ``r`` that may take it
    (set ``[r, d]``), and a rank with no extra left to one of its columns ``d'`` (clear
    ``[r, d']``), until a rank with ``left > 0``. The cells to write, in order."""
    prev: dict[tuple[str, int], tuple[str, int] | None] = {("d", start): None}
    queue = [("d", start)]
    found: tuple[str, int] | None = None
    while queue and found is None:
        kind, node = queue.pop(0)
        if kind == "d":
            for r in np.flatnonzero(allowed[:, node] & ~picked[:, node]).tolist():
                if ("r", r) in prev:
                    continue
                prev[("r", r)] = (kind, node)
                if left[r] > 0:
                    found = ("r", r)
                    break
                queue.append(("r", r))
        else:
            for d in np.flatnonzero(picked[node]).tolist():
                if ("d", d) not in prev:
                    prev[("d", d)] = (kind, node)
                    queue.append(("d", d))
    if found is None:
        return None
    cells: list[tuple[int, int, bool]] = []
    here = found
    before = prev[here]
    while before is not None:
        if here[0] == "r":
            cells.append((here[1], before[1], True))
        else:
            cells.append((before[1], here[1], False))
        here, before = before, prev[before]
    return cells


def _per_rank(counts: np.ndarray, totals: np.ndarray, p: np.ndarray, q: int) -> np.ndarray:
    """Largest deficit per rank, one sample at a time: the fallback that keeps each rank
    within one of its target when no step keeps the totals too."""
    logger.warning(
        "mixture blend: no step keeps the totals within two samples here; this step "
        "balances each rank alone (NOTE[blend-rule])"
    )
    out = counts.copy()
    for r in range(out.shape[0]):
        n = int(out[r].sum())
        while n < int(totals[r]):
            n += 1
            d = int(np.argmax(n * p - out[r] * q))
            out[r, d] += 1
    return out


def walk_segment(
    weights: BlendWeights, sizes: Iterator[np.ndarray] | Sequence[np.ndarray], ranks: int
) -> Iterator[np.ndarray]:
    """The per-step compositions of a segment: for each step's ``[W]`` batch sizes, the
    ``[W, D]`` samples per rank and source that step takes (NOTE[blend-rule]).

    NOTE[blend-period]: the rule is a function of the counts, so once every count equals
    its target exactly (the weights' fractions times the samples are integers, and no
    extra is pending) the steps of equal size so far repeat. The walk then replays that
    period instead of solving each step: with weights like ``[0.7, 0.2, 0.1]`` a step
    costs a lookup. Weights whose denominator does not divide a few batches (``1/3`` at
    ``B=256``: three steps) still find one; weights with a huge denominator solve every
    step (about 0.1-0.3 ms each).
    """
    p = np.asarray(weights.numerators, dtype=np.int64)
    q = weights.denominator
    counts = np.zeros((ranks, len(p)), dtype=np.int64)
    totals = np.zeros(ranks, dtype=np.int64)
    since: list[np.ndarray] | None = []
    first: np.ndarray | None = None
    period: list[np.ndarray] = []
    at = 0
    for size in sizes:
        if period and first is not None and np.array_equal(size, first):
            comp = period[at]
            at = (at + 1) % len(period)
            counts += comp
            totals += size
            yield comp
            continue
        totals = totals + size
        after = blend_step(counts, totals, weights)
        comp = after - counts
        counts = after
        if since is not None and not period:
            if first is None:
                first = np.array(size, copy=True)
            if np.array_equal(size, first):
                since.append(comp)
                if (counts * q == totals[:, None] * p[None, :]).all():
                    period = since  # NOTE[blend-period]
            else:
                since = None
        yield comp
