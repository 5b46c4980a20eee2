"""A multi-part token store read as one dataset, its parts mapped only when read, no descriptor held per map.

The store's header records each part's rows and tokens, which place every row and token without opening a part.
`Parts` opens part `k` the first time a row or token of it is read (the loader `token_store` gives: through the
store's folder, one descriptor for the whole store), and `map_array` maps a file so that the map holds no descriptor:
opening costs the same for 1 part or 1,000, and reading every part keeps the process's descriptors where they were.
`Concat` indexes the parts' `input_ids` (or `labels`) as their concatenation, `PartOffsets` the rows' offsets into
it, and `Joined` is what needs every part at once (the whole chunk index: `validate`, never the runtime). A row
never spans two parts: a row's tokens are a view of one part's map.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO, Generic, TypeVar

import numpy as np

T = TypeVar("T")


def map_array(f: BinaryIO, offset: int, dtype: np.dtype, length: int) -> np.ndarray:
    """`length` elements of `dtype` at `offset` of the open file `f`, mapped read-only, holding no descriptor once
    `f` is closed: pyarrow maps the file through `/proc/self/fd` and closes its own descriptor, and the mapping
    alone keeps the file (so a store of a thousand parts costs no descriptor per part, and a store deleted or
    replaced after it was opened still reads as it was). Without /proc, numpy's map (one descriptor each)."""
    proc = f"/proc/self/fd/{f.fileno()}"
    if not os.path.exists(proc):
        return np.memmap(f, dtype=dtype, mode="r", offset=offset, shape=(length,))
    import pyarrow as pa

    try:
        mm = pa.memory_map(proc)
    except OSError as exc:  # Arrow's IOError carries the errno only in its text
        if "errno 24" in str(exc).lower():
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), proc) from None
        raise
    with mm:
        buffer = mm.read_buffer()
    return np.frombuffer(buffer, dtype=dtype, count=length, offset=offset)


def _starts(counts: Sequence[int]) -> np.ndarray:
    out = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(np.asarray(counts, dtype=np.int64), out=out[1:])
    return out


class Parts(Generic[T]):
    """The parts in row order, each loaded (`load(k)`) the first time it is asked for and kept."""

    def __init__(self, rows: Sequence[int], tokens: Sequence[int], load: Callable[[int], T]):
        self.row_starts, self.token_starts = _starts(rows), _starts(tokens)
        self._load = load
        self._loaded: dict[int, T] = {}

    def __len__(self) -> int:
        return int(self.row_starts.shape[0] - 1)

    def __getitem__(self, k: int | slice) -> Any:
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        found = self._loaded.get(k)
        if found is None:
            found = self._loaded[k] = self._load(k)
        return found

    def __iter__(self) -> Iterator[T]:  # every part: what checks of the whole store read
        return (self[k] for k in range(len(self)))

    def of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The part of each row (the end row, `rows`, belongs to the last part)."""
        return np.minimum(np.searchsorted(self.row_starts, rows, side="right") - 1, len(self) - 1)


class Concat:
    """Read-only 1-D arrays indexed as their concatenation without copying them: part `k`'s array is `part(k)`
    (read when first indexed), `starts` its first element. A slice inside one part is a view of it; a slice across
    parts or an index array gathers from each part."""

    def __init__(self, starts: np.ndarray, part: Callable[[int], np.ndarray], dtype: np.dtype):
        self.starts, self._part_array, self.dtype = starts, part, np.dtype(dtype)
        self.shape = (int(starts[-1]),)
        self.size, self.ndim = self.shape[0], 1

    def __len__(self) -> int:
        return self.size

    @property
    def parts(self) -> list[np.ndarray]:
        """Every part's array (reads them all)."""
        return [self._part_array(k) for k in range(self.starts.shape[0] - 1)]

    def _part(self, i: int) -> int:
        return int(np.searchsorted(self.starts, i, side="right") - 1)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            a, b, step = key.indices(self.size)
            if step != 1 or b <= a:
                return self[np.arange(a, b, step, dtype=np.int64)] if step != 1 else np.zeros(0, self.dtype)
            k, last = self._part(a), self._part(b - 1)
            if k == last:
                return self._part_array(k)[a - self.starts[k]:b - self.starts[k]]
            return np.concatenate([self._part_array(j)[max(a - self.starts[j], 0):min(b, self.starts[j + 1]) -
                                                       self.starts[j]] for j in range(k, last + 1)])
        if np.isscalar(key):
            i = int(key) + (self.size if int(key) < 0 else 0)
            k = self._part(i)
            return self._part_array(k)[i - self.starts[k]]
        idx = np.asarray(key, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.size):
            raise IndexError(f"indices {int(idx.min())}..{int(idx.max())} out of range (0..{self.size - 1})")
        out = np.empty(idx.shape, self.dtype)
        which = np.searchsorted(self.starts, idx, side="right") - 1
        for k in np.flatnonzero(np.bincount(which.ravel(), minlength=1)).tolist():
            sel = which == k
            out[sel] = self._part_array(k)[idx[sel] - self.starts[k]]
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        joined = np.concatenate(self.parts) if self.starts.shape[0] > 1 else np.zeros(0, self.dtype)
        return joined if dtype is None else joined.astype(dtype)

    def max(self) -> int:
        """Largest value over all parts (the vocabulary bound)."""
        return max(int(p.max()) for p in self.parts if p.size)


class PartOffsets:
    """The rows' token offsets (rows + 1 entries) of the parts as one array: row `i` of part `k` starts at that
    part's own offset of it plus the tokens of the parts before (`offsets(k)`, read when first indexed)."""

    def __init__(self, parts: Parts[Any], offsets: Callable[[int], np.ndarray]):
        self.parts, self._offsets = parts, offsets
        self.shape, self.dtype, self.ndim = (int(parts.row_starts[-1]) + 1,), np.dtype(np.int64), 1
        self.size = self.shape[0]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return self[np.arange(*key.indices(self.size), dtype=np.int64)]
        if np.isscalar(key):
            i = int(key) + (self.size if int(key) < 0 else 0)
            return int(self[np.array([i])][0])
        rows = np.asarray(key, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.size):
            raise IndexError(f"row offsets {int(rows.min())}..{int(rows.max())} out of range (0..{self.size - 1})")
        which = self.parts.of_rows(rows)
        out = np.empty(rows.shape, np.int64)
        for k in np.flatnonzero(np.bincount(which.ravel(), minlength=1)).tolist():
            sel = which == k
            out[sel] = self._offsets(k)[rows[sel] - self.parts.row_starts[k]] + self.parts.token_starts[k]
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        joined = self[np.arange(self.size, dtype=np.int64)]
        return joined if dtype is None else joined.astype(dtype)


class Joined:
    """An array made from every part at once (`make()`, the first time it is read): the whole store's chunk index,
    which only checks of the whole store read."""

    def __init__(self, make: Callable[[], np.ndarray]):
        self._make, self._array = make, None

    @property
    def array(self) -> np.ndarray:
        """The array (made now if it was not)."""
        if self._array is None:
            self._array = self._make()
        return self._array

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape (made now if it was not)."""
        return self.array.shape

    def __len__(self) -> int:
        return int(self.array.shape[0])

    def __getitem__(self, key: Any) -> Any:
        return self.array[key]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.array if dtype is None else self.array.astype(dtype)
