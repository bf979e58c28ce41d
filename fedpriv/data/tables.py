"""The one reader of delimited tables: every rating, metadata, items or features file that
fedpriv reads, for the built-in data sets and for ``csv:`` files alike, goes through
:func:`read_table`, and every problem in it is a :class:`~fedpriv.errors.DataError` naming the
file and the 1-based physical line (the header is line 1).

A file is described by a :class:`Layout`: its base name in its :class:`Source` (a folder, a zip
archive or one file), its separator, whether a header line comes first, and its columns:

- a **preset** names and types them (``kinds``: "int", "float" or "str" per column). The
  header, when there is one, must name those columns; every line must hold exactly that many
  fields; numbers must parse. Each built-in data set is a set of presets
  (:mod:`fedpriv.data.loaders`: ``u.data``, ``movies.csv``, ...). Fast path: pandas' C parser
  with those dtypes; when it fails, the lines are parsed again in chunks, and a chunk the fast
  parser rejects is scanned line by line to name its first bad line.
- a **user table** (``columns=None``) takes its column names from its header line (or is
  positional without one) and reads every cell as text; the checks of the values are the
  caller's (:mod:`fedpriv.data.frames`). A line with more fields than the header is an error at
  that line, an unclosed quote an error at the line where the field starts.

Both kinds share: the source (folder, zip member or file), the text encoding (UTF-8, else
Latin-1), blank lines skipped, a comma-separated file honouring CSV quotes, and
:class:`Table`, which maps a data row back to its line for every later check (the range rule of
:mod:`fedpriv.data.ranges`, ids, duplicates, catalogue membership).
"""

from __future__ import annotations

import csv
import fnmatch
import io
import re
import sys
import warnings
import zipfile
import zlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError

_INT_TEXT = re.compile(r"[+-]?\d{1,18}(?:\.0*)?")
_PANDAS_DTYPES = {"int": np.int64, "float": np.float64, "str": str}
_NUMPY_DTYPES = {"int": np.int64, "float": np.float64, "str": object}
_FAST_PARSE_ERRORS = (ValueError, OverflowError, pd.errors.ParserWarning)
_CHUNK_BYTES = 1 << 22  # lines are re-parsed in runs of about this size after a fast-path failure


# --------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Layout:
    """How one delimited text file is laid out.

    ``name``: its base name in the source. ``columns`` / ``kinds``: a preset's column names
    and kinds ("int", "float" or "str"); ``None`` for a user table (names from the header line,
    every cell text). ``header``: the first line names the columns (for a preset, compared
    case-insensitively). ``rows``: what the data lines hold, for the message about an empty file.
    """

    name: str
    sep: str
    columns: tuple[str, ...] | None = None
    kinds: tuple[str, ...] | None = None
    header: bool = False
    rows: str = "one rating per line"

    @property
    def preset(self) -> bool:
        return self.kinds is not None


# --------------------------------------------------------------------------- sources


class Source:
    """A data folder, a zip archive or one file. Zip members are found by base name, at the top
    level or under one folder; folder files must sit directly in the folder. ``Source.file``:
    one file, named in messages as the caller wrote it."""

    def __init__(self, path: Path):
        self.path = path
        self._zip: zipfile.ZipFile | None = None
        self._file: tuple[str, Path] | None = None  # (how it is named, the file) for a one-file source
        self.parsed: dict[Layout, Table] = {}  # tables already read (metadata is read twice)
        if path.is_dir():  # a folder holding just the official zip, as downloaded, reads as that zip
            files = [p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")]
            if len(files) == 1 and files[0].suffix.lower() == ".zip":
                path = self.path = files[0]
        if path.is_dir():
            self._members = {p.name: [p.name] for p in files}
        elif path.is_file():
            self._zip = _open_zip(path)
            self._members = _index_zip(self._zip)
        else:
            raise DataError("no such file or folder", path=str(path))

    @classmethod
    def file(cls, path: str | Path) -> Source:
        """One file (a ``csv:`` table, an items or features file); messages name it as ``path``."""
        p = Path(path).expanduser()
        if p.is_dir():
            raise DataError("is a folder; expected a file", path=str(path))
        if not p.is_file():
            raise DataError("no such file", path=str(path))
        self = cls.__new__(cls)
        self.path, self._zip, self._file, self.parsed = p, None, (str(path), p), {}
        self._members = {p.name: [p.name]}
        return self

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._zip is not None:
            self._zip.close()

    def has(self, name: str) -> bool:
        """Whether a file with this base name exists."""
        return name in self._members

    def matching(self, pattern: str) -> list[str]:
        """Base names matching a shell pattern such as ``jester-data-*.csv``, sorted."""
        return sorted(n for n in self._members if fnmatch.fnmatchcase(n, pattern))

    def where(self, name: str) -> str:
        """How a file is named in messages: its path, or ``archive.zip/member``."""
        if self._file is not None:
            return self._file[0]
        return f"{self.path}/{self._member(name)}" if self._zip else str(self.path / name)

    def read(self, name: str) -> bytes:
        """The bytes of a file; DataError when it is missing or unreadable."""
        member = self._member(name)
        try:
            if self._zip is not None:
                return self._zip.read(member)
            return self._local(member).read_bytes()
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
            if self._file is not None:
                raise DataError(f"cannot read the file: {exc}", path=self._file[0]) from None
            raise DataError(f"cannot read {member}: {exc}", path=str(self.path)) from exc

    def _local(self, member: str) -> Path:
        return self._file[1] if self._file is not None else self.path / member

    def local_file(self, name: str) -> Path | None:
        """The file on disk holding ``name`` (None for a zip member)."""
        return None if self._zip is not None else self._local(self._member(name))

    def _member(self, name: str) -> str:
        """The zip member or folder file with this base name (exactly one)."""
        members = self._members.get(name, [])
        if not members:
            what = "zip archive has no member" if self._zip else "folder has no file"
            raise DataError(f"{what} named {name!r}", path=str(self.path))
        if len(members) > 1:
            raise DataError(f"several members named {name!r}: {', '.join(members)}", path=str(self.path))
        return members[0]


def _open_zip(path: Path) -> zipfile.ZipFile:
    """Open a zip archive, or raise a DataError naming it."""
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise DataError(f"not a data folder nor a valid zip archive ({exc})", path=str(path)) from exc


def _index_zip(archive: zipfile.ZipFile) -> dict[str, list[str]]:
    """Base name -> members, for files at the top level or under one folder."""
    index: dict[str, list[str]] = defaultdict(list)
    for info in archive.infolist():
        parts = info.filename.split("/")
        if not info.is_dir() and len(parts) <= 2:
            index[parts[-1]].append(info.filename)
    return dict(index)


# --------------------------------------------------------------------------- the table read


@dataclass
class Table:
    """A table read into a DataFrame, with what is needed to say where a row came from.

    ``style``: "csv" (a delimited file: 1-based physical lines, the header is line 1),
    "parquet" or "frame" (0-based row positions). ``kept``: the record number (0-based, after
    the header) of each row left once blank lines are dropped (None: all of them). ``blob`` or
    ``file``: the file's bytes, or the file, read again to number the lines only when an error
    is reported. ``records``: rows are CSV records, blank ones included (a user table; ``kept``
    skips the blank ones), else the lines holding more than blanks (a preset).
    """

    frame: pd.DataFrame
    where: str
    style: str
    kept: np.ndarray | None = None
    header: bool = True
    blob: bytes | None = None
    file: Path | None = None
    encoding: str = "utf-8"
    sep: str = ","
    records: bool = True
    layout: Layout | None = None
    _lines: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.frame)

    def values(self, position: int) -> np.ndarray:
        """The column at ``position`` as a numpy array (a preset's typed column)."""
        return self.frame.iloc[:, position].to_numpy()

    def arrays(self) -> list[np.ndarray]:
        """Every column as a numpy array, in order."""
        return [self.values(i) for i in range(self.frame.shape[1])]

    def _record(self, pos: int) -> int:
        return int(self.kept[pos]) if self.kept is not None else int(pos)

    def line(self, pos: int) -> int:
        """A delimited file: the 1-based line where data row ``pos`` starts."""
        if self._lines is None:
            blob = self.blob if self.blob is not None else self.file.read_bytes() if self.file is not None else None
            assert blob is not None, "a table read from a file keeps its bytes or its file"
            self._lines = _data_lines(blob, self.encoding, self.sep, self.header, records=self.records)
        return int(self._lines[self._record(pos)])

    def at(self, pos: int) -> str:
        """``line 5`` / ``row 3``: where data row ``pos`` is (for cross references)."""
        return f"line {self.line(pos)}" if self.style == "csv" else f"row {self._record(pos)}"

    def error(self, pos: int, message: str) -> DataError:
        if self.style == "csv":
            return DataError(message, path=self.where, line=self.line(pos))
        return DataError(f"row {self._record(pos)} (0-based): {message}", path=self.where)

    def file_error(self, message: str) -> DataError:
        """An error about the table as a whole (the header line for CSV)."""
        return DataError(message, path=self.where, line=1 if self.style == "csv" and self.header else None)

    def columns(self) -> list[str]:
        return [str(c) for c in self.frame.columns]

    def column(self, name: str, position: int, what: str, hint: str) -> tuple[pd.Series, str]:
        """The column named ``name`` (CSV without header: the one at ``position``) and how to
        name it in messages."""
        if self.style == "csv" and not self.header:
            if position >= self.frame.shape[1]:
                raise DataError(
                    f"expected at least {position + 1} columns with header=0 ({what} is column {position + 1}), "
                    f"found {self.frame.shape[1]}",
                    path=self.where, line=self.line(0) if len(self) else 1,
                )  # fmt: skip
            return self.frame.iloc[:, position], f"column {position + 1}"
        if name in self.frame.columns:
            column = self.frame[name]
            if isinstance(column, pd.DataFrame):
                raise self.file_error(f"several columns are named {name!r}")
            return column, f"column {name!r}"
        if name in [n for n in self.frame.index.names if n is not None]:
            return pd.Series(self.frame.index.get_level_values(name), index=self.frame.index), f"index level {name!r}"
        found = ", ".join(self.columns()) or "none"
        raise self.file_error(f"no {what} column {name!r} ({hint}); columns found: {found}")


def read_table(source: Source, layout: Layout) -> Table:
    """Read one delimited file of ``source`` as ``layout`` says (once per source: a later call
    returns the same table). DataError at the first bad line."""
    if layout not in source.parsed:
        where = source.where(layout.name)
        if layout.preset:
            source.parsed[layout] = _read_preset(source.read(layout.name), layout, where)
        else:  # a file on disk is read by pandas from the disk (and again only to number lines)
            file = source.local_file(layout.name)
            source.parsed[layout] = _read_user_table(
                file if file is not None else source.read(layout.name), layout, where
            )
    return source.parsed[layout]


def guess_encoding(blob: bytes) -> str:
    """UTF-8 when the bytes decode as such, else Latin-1 (older MovieLens and Last.fm files)."""
    try:
        blob.decode("utf-8")
    except UnicodeDecodeError:
        return "latin-1"
    return "utf-8"


# --------------------------------------------------------------------------- presets


def _read_preset(blob: bytes, layout: Layout, where: str) -> Table:
    """Parse a preset strictly: exact column count, numeric columns numeric.

    Text columns are decoded as UTF-8, or Latin-1 when the file is not valid UTF-8.
    """
    assert layout.columns is not None and layout.kinds is not None
    encoding = guess_encoding(blob) if "str" in layout.kinds else "utf-8"
    if layout.header:
        _check_header(blob, layout, where, encoding)
    columns = _try_fast_parse(blob, layout, encoding, skip_header=layout.header)
    if columns is None:
        columns = _scan(blob, layout, where, encoding)
    frame = pd.DataFrame(dict(enumerate(columns)), copy=False) if columns else pd.DataFrame()
    return Table(
        frame,
        where,
        "csv",
        header=layout.header,
        blob=blob,
        encoding=encoding,
        sep=layout.sep,
        records=False,
        layout=layout,
    )


def _try_fast_parse(blob: bytes, layout: Layout, encoding: str, *, skip_header: bool) -> list[np.ndarray] | None:
    """The fast parse, or None when it fails or does not apply.

    The C parser pads missing trailing fields with "" instead of failing, which would hide a
    short line when the last column is text: such (small, metadata) tables are always scanned.
    """
    assert layout.kinds is not None
    if layout.kinds[-1] == "str":
        return None
    try:
        return _fast_parse(blob, layout, encoding, skip_header=skip_header)
    except _FAST_PARSE_ERRORS:
        return None


def _check_header(blob: bytes, layout: Layout, where: str, encoding: str) -> None:
    """The first line must name the preset's columns."""
    assert layout.columns is not None
    end = blob.find(b"\n")
    first = blob[: end if end >= 0 else len(blob)].decode(encoding, errors="replace")
    first = first.removeprefix("\ufeff").removesuffix("\r")
    found = [f.strip().lower() for f in _split(first, layout.sep)]
    if found != [c.lower() for c in layout.columns]:
        expected = layout.sep.join(layout.columns)
        raise DataError(f"expected the header {expected!r}, found {first!r}", path=where, line=1)


def _fast_parse(blob: bytes, layout: Layout, encoding: str, *, skip_header: bool) -> list[np.ndarray]:
    """pandas C parser; raises one of ``_FAST_PARSE_ERRORS`` on anything irregular (except
    missing trailing text fields, see :func:`_try_fast_parse`)."""
    assert layout.columns is not None and layout.kinds is not None
    sep = layout.sep
    if len(sep) > 1:  # the C parser needs a one-character separator
        blob = blob.replace(sep.encode(), b"\t")
        sep = "\t"
    names = [f"c{i}" for i in range(len(layout.columns))]
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.ParserWarning)  # e.g. extra fields on line 1
        frame = pd.read_csv(
            io.BytesIO(blob),
            sep=sep,
            header=None,
            names=names,
            index_col=False,
            skiprows=1 if skip_header else 0,
            dtype={n: _PANDAS_DTYPES[k] for n, k in zip(names, layout.kinds)},
            encoding=encoding,
            na_filter=False,
            quoting=csv.QUOTE_MINIMAL if sep == "," else csv.QUOTE_NONE,
            engine="c",
        )
    return [frame[n].to_numpy() for n in names]


def _scan(blob: bytes, layout: Layout, where: str, encoding: str) -> list[np.ndarray]:
    """Chunk by chunk: the fast parser where it works, else a careful line-by-line parse that
    raises a DataError at the first bad line."""
    assert layout.columns is not None
    parts = [
        _parse_chunk(chunk, first_line, layout, where, encoding) for first_line, chunk in _chunks(blob, layout.header)
    ]
    return [np.concatenate([p[i] for p in parts]) for i in range(len(layout.columns))]


def _parse_chunk(chunk: bytes, first_line: int, layout: Layout, where: str, encoding: str) -> list[np.ndarray]:
    """Fast parse of whole lines when it applies and succeeds, else the careful scan."""
    columns = _try_fast_parse(chunk, layout, encoding, skip_header=False)
    return _scan_lines(chunk, first_line, layout, where, encoding) if columns is None else columns


def _scan_lines(chunk: bytes, first_line: int, layout: Layout, where: str, encoding: str) -> list[np.ndarray]:
    """Careful parse of whole lines numbered from ``first_line``."""
    assert layout.columns is not None and layout.kinds is not None
    n_cols = len(layout.columns)
    values: list[list] = [[] for _ in range(n_cols)]
    for line_no, raw in _nonblank(chunk, first_line):
        fields = _split(raw.decode(encoding, errors="replace").removesuffix("\r"), layout.sep)
        if len(fields) != n_cols:
            raise DataError(
                f"expected {n_cols} fields ({layout.sep.join(layout.columns)}), found {len(fields)}",
                path=where,
                line=line_no,
            )
        for out, field, column, kind in zip(values, fields, layout.columns, layout.kinds):
            out.append(_convert(field, kind, column, where, line_no))
    return [np.array(v, dtype=_NUMPY_DTYPES[k]) for v, k in zip(values, layout.kinds)]


def _chunks(blob: bytes, header: bool) -> Iterator[tuple[int, bytes]]:
    """(number of its first line, bytes) of consecutive runs of whole lines, after the header.

    Always yields at least one (possibly empty) chunk.
    """
    start, line_no = 0, 1
    if header:
        start = blob.find(b"\n") + 1 or len(blob)
        line_no = 2
    while True:
        end = blob.find(b"\n", min(start + _CHUNK_BYTES, len(blob)))
        end = len(blob) if end < 0 else end + 1
        chunk = blob[start:end]
        yield line_no, chunk
        if end >= len(blob):
            return
        line_no += chunk.count(b"\n")
        start = end


def _nonblank(chunk: bytes, first_line: int) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of the lines holding more than blanks."""
    for line_no, raw in enumerate(chunk.split(b"\n"), start=first_line):
        if raw.strip(b" \t\r"):
            yield line_no, raw


def _split(line: str, sep: str) -> list[str]:
    """Split one line into fields (CSV quoting rules for commas)."""
    if sep == ",":
        return next(csv.reader([line]), [])
    return line.split(sep)


def _convert(field: str, kind: str, column: str, where: str, line_no: int) -> int | float | str:
    """Convert one field, or raise a DataError naming the column and the line."""
    if kind == "str":
        return field
    text = field.strip()
    if kind == "int":
        if _INT_TEXT.fullmatch(text):
            return int(text.split(".")[0])
        raise DataError(f"{column} {field!r} is not an integer", path=where, line=line_no)
    try:
        if "_" not in text:
            return float(text)
    except ValueError:
        pass
    raise DataError(f"{column} {field!r} is not a number", path=where, line=line_no)


# --------------------------------------------------------------------------- user tables


def _read_user_table(data: bytes | Path, layout: Layout, where: str) -> Table:
    """Every cell as text (pandas' C parser); blank lines (and lines of empty fields) dropped.
    ``data``: the bytes, or the file on disk."""
    frame = None
    sep, header = layout.sep, layout.header
    for encoding in ("utf-8", "latin-1"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", pd.errors.ParserWarning)
                frame = pd.read_csv(
                    io.BytesIO(data) if isinstance(data, bytes) else data, sep=sep, header=0 if header else None,
                    dtype=str, keep_default_na=False, na_filter=False, skip_blank_lines=False, index_col=False,
                    engine="c", encoding=encoding,
                )  # fmt: skip
            break
        except UnicodeDecodeError:
            continue
        except pd.errors.EmptyDataError:
            need = "a header line naming the columns, then " if header else ""
            raise DataError(f"the file is empty; expected {need}{layout.rows}", path=where) from None
        except (pd.errors.ParserError, pd.errors.ParserWarning) as exc:
            raise _parse_error(
                data if isinstance(data, bytes) else data.read_bytes(), where, encoding, sep, header, exc
            ) from None
        except OSError as exc:
            raise DataError(f"cannot read the file: {exc}", path=where) from None
    assert frame is not None  # latin-1 decodes any bytes
    if header:
        frame.columns = [str(c).strip() for c in frame.columns]
    blob, file = (data, None) if isinstance(data, bytes) else (None, data)
    encoding = "utf-8-sig" if encoding == "utf-8" else encoding
    table = Table(frame, where, "csv", header=header, blob=blob, file=file, encoding=encoding, sep=sep, layout=layout)
    blank = _blank_rows(frame)
    if blank is not None:
        table.kept = np.flatnonzero(~blank)
        table.frame = frame.iloc[table.kept].reset_index(drop=True)
    return table


def _blank_rows(frame: pd.DataFrame) -> np.ndarray | None:
    """Rows whose every field is empty or blank (blank lines); None when there are none."""
    if frame.shape[1] == 0 or not len(frame):
        return None
    blank = frame.iloc[:, 0].str.strip().to_numpy() == ""
    if not blank.any():
        return None
    candidates = np.flatnonzero(blank)
    for c in range(1, frame.shape[1]):
        values = frame.iloc[candidates, c].str.strip().to_numpy()
        candidates = candidates[values == ""]
    out = np.zeros(len(frame), dtype=bool)
    out[candidates] = True
    return out if out.any() else None


def _parse_error(blob: bytes, where: str, encoding: str, sep: str, header: bool, exc: Exception) -> DataError:
    """A DataError at the first line the C parser could not split."""
    encoding = "utf-8-sig" if encoding == "utf-8" else encoding
    expected = None
    for line, fields_ in csv_records(blob, encoding, sep, strict=True):
        if isinstance(fields_, csv.Error):
            if "end of data" in str(fields_):
                return DataError('a quoted field (starting with ") is never closed', path=where, line=line)
            return DataError(f"cannot split the line into fields: {fields_}", path=where, line=line)
        if not fields_ or all(not f.strip() for f in fields_):
            continue
        if expected is None:
            expected = len(fields_)
            continue
        if len(fields_) > expected:
            what = "the header" if header else "the first line"
            return DataError(f"expected {expected} fields (as on {what}), found {len(fields_)}", path=where, line=line)
    return DataError(f"cannot parse the file: {exc}", path=where)


# --------------------------------------------------------------------------- line numbers


def csv_records(blob: bytes, encoding: str, sep: str, *, strict: bool = False):
    """(start line, fields) of each record, as the C parser splits them (blank lines included);
    ``strict``: stop at a malformed quoted field, yielding (its start line, the csv.Error)."""
    limit = csv.field_size_limit()
    csv.field_size_limit(sys.maxsize)
    try:
        with io.TextIOWrapper(io.BytesIO(blob), encoding=encoding, errors="replace", newline="") as fh:
            reader = csv.reader(fh, delimiter=sep, quotechar='"', doublequote=True, strict=strict)
            previous = 0
            while True:
                try:
                    fields_ = next(reader)
                except StopIteration:
                    return
                except csv.Error as exc:
                    yield previous + 1, exc
                    return
                yield previous + 1, fields_
                previous = reader.line_num
    finally:
        csv.field_size_limit(limit)


def _data_lines(blob: bytes, encoding: str, sep: str, header: bool, *, records: bool) -> np.ndarray:
    """The 1-based line where each data row starts, in order: with ``records`` every CSV record
    after the header (blank ones included: :attr:`Table.kept` skips them), else every line after
    the header holding more than blanks."""
    if records:
        starts = [line for line, _ in csv_records(blob, encoding, sep)]
        return np.asarray(starts[1 if header else 0 :], dtype=np.int64)
    numbers = (line for first, chunk in _chunks(blob, header) for line, _ in _nonblank(chunk, first))
    return np.fromiter(numbers, dtype=np.int64)
