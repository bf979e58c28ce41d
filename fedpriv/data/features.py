"""Item side features (genres, release year, tags) as a sparse multi-hot matrix.

Each named field ("genre", "year", "tag") owns a contiguous range of columns; every column has
a readable name such as ``genre=Comedy``, ``year=1990-1994`` or ``tag=funny``. Rows follow the
dense item ids of an :class:`~fedpriv.data.interactions.Interactions`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

NO_GENRE = "(no genres listed)"
UNKNOWN_YEAR = "unknown"

_TITLE_YEAR = re.compile(r"\((\d{4})(?:\s*[-\u2013]\s*\d{0,4})?\)\s*$")
_RELEASE_DATE = re.compile(r"^\s*\d{1,2}-[A-Za-z]{3}-(\d{4})\s*$")

# (row indices, column indices within the field, column names) of one field
_Field = tuple[list[int], list[int], list[str]]


@dataclass
class ItemFeatures:
    """Multi-hot item features: ``matrix[i, j] == 1`` when item ``i`` has feature ``columns[j]``.

    ``fields`` maps a field name to its column range, e.g. ``fields["genre"] == slice(0, 19)``.
    """

    matrix: sp.csr_matrix
    fields: dict[str, slice]
    columns: list[str]
    names: list[str] | None = None  # display name of each item (movie titles), public metadata; not a feature

    def __post_init__(self) -> None:
        if self.matrix.shape[1] != len(self.columns):
            raise ValueError("one column name is needed per matrix column")

    @property
    def n_items(self) -> int:
        """Number of rows (items)."""
        return self.matrix.shape[0]

    def item_field_ids(self, field: str) -> list[np.ndarray]:
        """Per item, the active column indices within ``field`` (0-based inside the field).

        Suited to ``torch.nn.EmbeddingBag`` inputs; raises ``KeyError`` for an unknown field.
        """
        sub = self.matrix[:, self.fields[field]].tocsr()
        sub.sort_indices()
        return [sub.indices[sub.indptr[i] : sub.indptr[i + 1]].astype(np.int64) for i in range(self.n_items)]


def parse_title_year(title: str) -> int | None:
    """Year at the end of a MovieLens title: ``"Toy Story (1995)"`` -> 1995, else None.

    Also accepts series ranges such as ``"Babylon 5 (1994-1998)"`` (first year).
    """
    match = _TITLE_YEAR.search(title)
    return int(match.group(1)) if match else None


def parse_release_year(date: str) -> int | None:
    """Year of an ML-100K release date: ``"01-Jan-1995"`` -> 1995; empty or malformed -> None."""
    match = _RELEASE_DATE.match(date)
    return int(match.group(1)) if match else None


def build_item_features(
    n_items: int,
    item_raw_ids: Sequence[Hashable] | np.ndarray,
    genres: Mapping[Hashable, Sequence[str]] | None,
    years: Mapping[Hashable, int | None] | None,
    tags: Mapping[Hashable, Sequence[str]] | None = None,
    *,
    genre_vocab: Sequence[str] | None = None,
    year_bucket: int = 5,
    min_tag_count: int = 5,
    max_tags: int | None = None,
) -> ItemFeatures:
    """Build the multi-hot feature matrix for items given in dense order.

    ``item_raw_ids[i]`` is the original id of dense item ``i``; the mappings are keyed by
    original ids and may omit items. A field is built only when its mapping is given:

    * ``genre``: one column per genre, in ``genre_vocab`` order when given, else sorted;
      ``"(no genres listed)"`` means no genre.
    * ``year``: buckets of ``year_bucket`` years covering the known years, plus ``year=unknown``.
    * ``tag``: lower-cased, stripped tags applied at least ``min_tag_count`` times over the given
      items, most frequent first, at most ``max_tags`` of them.
    """
    raw_ids = np.asarray(item_raw_ids).tolist()
    if len(raw_ids) != n_items:
        raise ValueError(f"expected {n_items} item ids, got {len(raw_ids)}")
    if year_bucket < 1:
        raise ValueError("year_bucket must be >= 1")
    built: dict[str, _Field] = {}
    if genres is not None:
        built["genre"] = _genre_field(raw_ids, genres, genre_vocab)
    if years is not None:
        built["year"] = _year_field(raw_ids, years, year_bucket)
    if tags is not None:
        built["tag"] = _tag_field(raw_ids, tags, min_tag_count, max_tags)
    return assemble_fields(n_items, [(name, *field) for name, field in built.items()])


def assemble_fields(
    n_items: int,
    built: Sequence[tuple[str, Sequence[int], Sequence[int], Sequence[str]]],
    names: list[str] | None = None,
) -> ItemFeatures:
    """Stack feature fields side by side into one binary CSR matrix: each field is (name, rows,
    columns within the field, column labels); a value given twice in one cell is one feature.
    The one assembler of the built-in loaders and the csv/parquet reader."""
    rows, cols, columns, fields = [], [], [], {}
    for name, f_rows, f_cols, labels in built:
        offset = len(columns)
        rows.append(np.asarray(f_rows, dtype=np.int64))
        cols.append(np.asarray(f_cols, dtype=np.int64) + offset)
        columns.extend(f"{name}={label}" for label in labels)
        fields[name] = slice(offset, len(columns))
    r = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    c = np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)
    matrix = sp.csr_matrix((np.ones(len(r), dtype=np.float32), (r, c)), shape=(n_items, len(columns)), dtype=np.float32)
    matrix.sum_duplicates()
    matrix.data[:] = 1.0
    matrix.sort_indices()
    return ItemFeatures(matrix=matrix, fields=fields, columns=columns, names=names)


def _multi_hot(per_item: list[set[str]], vocab: Sequence[str]) -> _Field:
    """Rows and columns of the (item, value) pairs whose value is in ``vocab``."""
    index = {v: j for j, v in enumerate(vocab)}
    rows: list[int] = []
    cols: list[int] = []
    for i, values in enumerate(per_item):
        active = sorted(index[v] for v in values if v in index)
        rows.extend([i] * len(active))
        cols.extend(active)
    return rows, cols, list(vocab)


def _genre_field(
    raw_ids: list[Hashable], genres: Mapping[Hashable, Sequence[str]], vocab: Sequence[str] | None
) -> _Field:
    """Multi-hot genres."""
    per_item = [{g.strip() for g in genres.get(r, ())} - {NO_GENRE, ""} for r in raw_ids]
    if vocab is None:
        vocab = sorted(set().union(*per_item))
    unknown = set().union(*per_item) - set(vocab)
    if unknown:
        raise ValueError(f"genres not in the genre vocabulary: {sorted(unknown)}")
    return _multi_hot(per_item, vocab)


def _year_field(raw_ids: list[Hashable], years: Mapping[Hashable, int | None], bucket: int) -> _Field:
    """One-hot release-year bucket; the last column is the unknown year."""
    starts = [None if years.get(r) is None else int(years[r]) // bucket * bucket for r in raw_ids]
    known = [s for s in starts if s is not None]
    first = min(known, default=0)
    n_buckets = (max(known) - first) // bucket + 1 if known else 0
    names = [_bucket_name(first + k * bucket, bucket) for k in range(n_buckets)] + [UNKNOWN_YEAR]
    cols = [n_buckets if s is None else (s - first) // bucket for s in starts]
    return list(range(len(raw_ids))), cols, names


def _bucket_name(start: int, bucket: int) -> str:
    """``1990-1994`` for a 5-year bucket, ``1990`` for a 1-year bucket."""
    return str(start) if bucket == 1 else f"{start}-{start + bucket - 1}"


def _tag_field(
    raw_ids: list[Hashable], tags: Mapping[Hashable, Sequence[str]], min_count: int, max_tags: int | None
) -> _Field:
    """Multi-hot tags frequent enough over the given items."""
    applied = [[t.strip().lower() for t in tags.get(r, ())] for r in raw_ids]
    counts = Counter(t for item_tags in applied for t in item_tags if t)
    vocab = sorted((t for t, c in counts.items() if c >= min_count), key=lambda t: (-counts[t], t))
    if max_tags is not None:
        vocab = vocab[:max_tags]
    return _multi_hot([set(item_tags) for item_tags in applied], vocab)
