"""Plain text and JSON Lines files read in byte ranges cut at line ends, parquet files in ranges of rows:
prepare_data.py's jobs each read only their own piece, so the hosts of a pod share the reading as they share the
tokenizing, and no copy of the text is made (`datasets`' arrow copy costs ~4.5 bytes per token of disk and a pass
over the whole corpus on every host).

    spans = cut(files, 4)                                  # 4 (start, end) ranges of the files' bytes, end to end
    for lines in read_lines(files, spans[0], "--train_file"):
        ...                                                # lists of that range's lines, blank ones too
    n = count_lines(files, spans[0])                       # how many lines that is, without decoding them
    for texts in read_json_texts(files, spans[0], "--train_file", "text"):
        ...                                                # lists of the texts of that range's JSON objects
    split = file_splits(src)["train"]                      # a FileSplit: its cut(k), count(span), texts(span, job)

The lines are those of `datasets`' "text" builder, which load_raw_text uses: UTF-8, "\\r\\n" and "\\r" read as
"\\n", one text per "\\n", the line break kept with keep_linebreaks. The JSON objects are those of its "json"
builder for JSON Lines (.jsonl, .json): one object per line, blank lines none, a missing key or null no text. Bytes
that are not UTF-8, and a line that is not a JSON object, are a UserError naming the file and line. A range starts
at the start of a line (a file's start, or the byte after a "\\n"), so the ranges' lines, in order, are the files'
lines. Parquet files give the rows of the column load_raw_text would choose, in order, null no text.
"""
import dataclasses
import json
import os

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flaxlm.data.text import (COMPRESSIONS, check_text_options, checked_files, feature_types, held_out_count,
                              held_out_mask, text_column)
from flaxlm.errors import UserError, decode_utf8_line

PLAIN = (".txt", ".text")  # the extensions read here (uncompressed): plain text,
JSON_LINES = (".jsonl", ".json")  # and JSON Lines, when every file starts with an object holding the text
JSON_SPACE = " \t\r\n"  # what JSON calls whitespace: a line of only these holds no object
PARQUET = (".parquet",)  # and parquet files, in ranges of rows
PARQUET_BATCH = 1 << 14  # rows read at a time
FIRST_LINE_LIMIT = 64 << 20  # bytes of a file's first line read to tell JSON Lines (a longer one: datasets reads it)

BLOCK = 8 << 20  # bytes read at a time (and then to the end of their line)


def cut(files, k):
    """Up to k (start, end) ranges covering the files' bytes (laid end to end, in order), each of about
    1/k of them and starting at a line's start; fewer when lines are longer than a range."""
    ends = _file_ends(files)
    bounds = sorted({0, ends[-1], *(_line_start(files, ends, ends[-1] * i // k) for i in range(1, k))})
    return list(zip(bounds[:-1], bounds[1:]))


def contiguous(n, k):
    """min(k, n) (start, end) ranges of n items (at least one range), cut as datasets' Dataset.shard(contiguous=True)
    cuts them: the first n % k ranges one item longer."""
    k = max(1, min(k, n))
    div, mod = divmod(n, k)
    starts = [div * i + min(i, mod) for i in range(k + 1)]
    return list(zip(starts[:-1], starts[1:]))


def read_lines(files, span, where, keep_linebreaks=False):
    """Lists of the lines of the range span=(start, end) of the files, a block of bytes at a time (blank lines
    included; their line breaks kept with keep_linebreaks); `where` names the files in an error ("--train_file")."""
    for path, start, end in _pieces(files, span):
        for offset, block in _blocks(path, start, end):
            try:
                text = block.decode("utf-8")
            except UnicodeDecodeError as e:
                _raise_not_utf8(path, where, offset, block, e.start)
            if "\r" in text:
                text = text.replace("\r\n", "\n").replace("\r", "\n")
            lines = text.split("\n")
            last = lines.pop()  # "" after a final line break; else a last line without one (the file's end)
            if keep_linebreaks:
                lines = [line + "\n" for line in lines]
            if last:
                lines.append(last)
            yield lines


def read_json_texts(files, span, where, column):
    """Lists of the `column` values of the JSON objects in the range span=(start, end) of JSON Lines files, one per
    object (None where an object lacks it or holds null), a block of bytes at a time."""
    for path, start, end in _pieces(files, span):
        for offset, block in _blocks(path, start, end):
            try:
                lines = block.decode("utf-8").split("\n")
            except UnicodeDecodeError as e:
                _raise_not_utf8(path, where, offset, block, e.start)
            texts = []
            for i, line in enumerate(lines):
                if not line.strip(JSON_SPACE):
                    continue
                obj = _json_object(line)
                value = None if obj is None else obj.get(column)
                if obj is None or not (value is None or isinstance(value, str)):
                    raise UserError(f"{where} {path} line {_line_number(path, offset, i)} is not a JSON "
                                    f"object with a string under \"{column}\" ({line[:60]!r}); fix the line, or pass "
                                    f"--text_column with the key of the text")
                texts.append(value)
            yield texts


def _json_object(line):
    """The JSON object of a line; None where it is not one."""
    try:
        value = json.loads(line)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return None
    return value if isinstance(value, dict) else None


def count_lines(files, span, json_lines=False):
    """The number of lines read_lines gives for span (with json_lines: of objects read_json_texts gives, its
    non-blank lines), counted in the bytes ("\\r" and "\\n" are never part of a longer UTF-8 sequence)."""
    count = 0
    for path, start, end in _pieces(files, span):
        block = b""
        for _, block in _blocks(path, start, end):
            if json_lines:
                count += sum(1 for line in block.split(b"\n") if line.strip(JSON_SPACE.encode()))
            else:
                if b"\r" in block:
                    block = block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                count += block.count(b"\n")
        if not json_lines:
            count += bool(block) and not block.endswith(b"\n")  # a last line without a line break
    return count


def _file_ends(files):
    """Where each file ends in the files' bytes laid end to end."""
    ends, total = [], 0
    for path in files:
        total += os.path.getsize(path)
        ends.append(total)
    return ends


def _line_start(files, ends, position):
    """The first line start at or after `position` (a file's start, or the byte after a "\\n"; a file's end)."""
    for i, end in enumerate(ends):
        begin = end - os.path.getsize(files[i])
        if begin <= position < end:
            if position == begin:
                return position
            with open(files[i], "rb") as f:
                f.seek(position - begin - 1)
                while chunk := f.read(1 << 16):
                    newline = chunk.find(b"\n")
                    if newline >= 0:
                        return min(end, f.tell() - len(chunk) + newline + 1 + begin)
            return end
    return ends[-1]


def _pieces(files, span):
    """(path, start, end) of each file's part of the range span, in file offsets."""
    for i, start, end in _overlaps([os.path.getsize(path) for path in files], span):
        yield files[i], start, end


def _overlaps(sizes, span):
    """(i, start, end) of the part of the range span in each piece i of these sizes laid end to end (files' bytes,
    parquet files' rows, a file's row groups), in the piece's offsets; pieces outside span left out."""
    begin = 0
    for i, size in enumerate(sizes):
        a, b = max(span[0], begin), min(span[1], begin + size)
        if a < b:
            yield i, a - begin, b - begin
        begin += size


def _blocks(path, start, end):
    """(offset, bytes) of [start, end) of a file in blocks of about BLOCK bytes, each ending at a line's end (or at
    `end`, which is a line's start or the file's end)."""
    with open(path, "rb") as f:
        f.seek(start)
        offset = start
        while offset < end:
            block = f.read(min(BLOCK, end - offset))
            if not block:
                return  # the file shrank under us: what is there is read
            if offset + len(block) < end and not block.endswith(b"\n"):
                block += f.readline(end - offset - len(block))  # to the end of the line (it ends before `end`)
            yield offset, block
            offset += len(block)


def _line_number(path, offset, line):
    """The number in the file of the line-th line of the block read at offset, counting the lines before the block
    only now (an error is being raised)."""
    before = 0
    with open(path, "rb") as f:
        left = offset
        while left > 0 and (chunk := f.read(min(BLOCK, left))):
            before += chunk.count(b"\n")
            left -= len(chunk)
    return before + line + 1


def _raise_not_utf8(path, where, offset, block, bad):
    """The UserError naming the file and line of the bytes that are not UTF-8 at block[bad] (block at offset)."""
    line_start = block.rfind(b"\n", 0, bad) + 1
    line_end = block.find(b"\n", bad)
    number = _line_number(path, offset, block.count(b"\n", 0, line_start))
    decode_utf8_line(block[line_start:None if line_end < 0 else line_end], f"{where} {path}", number)
    raise UserError(f"{where} {path} is not UTF-8 text (line {number}); convert the file to UTF-8 (e.g. iconv -f "
                    f"latin1 -t utf-8)")


@dataclasses.dataclass
class FileSplit:
    """A split of load_raw_text's read from files range by range: plain text files (reader "lines": ranges of
    bytes, its texts the non-blank lines), JSON Lines files ("json lines": ranges of bytes, the non-blank texts of
    the objects' `column`) or parquet files ("parquet": ranges of rows, the non-blank texts of `column`). With
    hold_out ({"percentage", "seed", "held"}) only those hold_out keeps for training (held False) or holds out
    (held True), once counted() has given it the lines (objects, rows) of every range."""
    files: list
    flag: str  # the flag that named the files ("--train_file"), for errors
    keep_linebreaks: bool = False
    hold_out: dict = None
    reader: str = "lines"
    column: str = None  # JSON Lines and parquet files: the key (column) of the text

    @property
    def where(self):
        return f"{self.flag} {', '.join(self.files)}"

    @property
    def unit(self):
        """What a range counts: "bytes" of the files, or "rows" of parquet files."""
        return "rows" if self.reader == "parquet" else "bytes"

    def cut(self, k):
        """Up to k (start, end) ranges covering the split, end to end: bytes cut at line starts (cut), or rows cut
        as datasets' Dataset.shard(contiguous=True) cuts them."""
        return cut(self.files, k) if self.reader != "parquet" else contiguous(sum(parquet_rows(self.files)), k)

    def count(self, span):
        """How many lines (objects, rows) range span holds: what counted() takes for each range."""
        if self.reader == "parquet":
            return span[1] - span[0]
        return count_lines(self.files, span, json_lines=self.reader == "json lines")

    def counted(self, lines_per_span):
        """This split with the hold-out's counts: how many lines each range (of the plan, in order) holds."""
        n = sum(lines_per_span)
        n_val = held_out_count(n, self.hold_out["percentage"], self.where)
        firsts = np.concatenate([[0], np.cumsum(lines_per_span)[:-1]]).tolist()
        return dataclasses.replace(self, hold_out={**self.hold_out, "n": n, "n_val": n_val, "first_lines": firsts})

    def texts(self, span, job):
        """Lists of the split's texts in range span (the plan's job-th)."""
        index = self.hold_out["first_lines"][job] if self.hold_out else 0
        if self.reader == "lines":
            reading = read_lines(self.files, span, self.flag, self.keep_linebreaks)
        elif self.reader == "json lines":
            reading = read_json_texts(self.files, span, self.flag, self.column)
        else:
            reading = read_parquet_texts(self.files, span, self.column)
        for lines in reading:
            if self.hold_out:
                h = self.hold_out
                held = held_out_mask(index, len(lines), h["n"], h["n_val"], h["seed"])
                index += len(lines)
                lines = [t for t, out in zip(lines, held) if out == h["held"]]
            yield [t for t in lines if t and not t.isspace()]


def parquet_rows(files):
    """The number of rows of each parquet file (from its footer)."""
    return [pq.ParquetFile(path).metadata.num_rows for path in files]


def read_parquet_texts(files, span, column):
    """Lists of the `column` values of rows span=(start, end) of parquet files laid end to end (None for null), a
    record batch at a time."""
    for i, a, b in _overlaps(parquet_rows(files), span):
        f = pq.ParquetFile(files[i])
        groups = [f.metadata.row_group(group).num_rows for group in range(f.num_row_groups)]
        for group, lo, hi in _overlaps(groups, (a, b)):
            read = 0  # rows of the group before the batch
            for batch in f.iter_batches(PARQUET_BATCH, row_groups=[group], columns=[column]):
                if read >= hi:
                    break
                texts = batch.column(0)[max(0, lo - read):hi - read].to_pylist()
                read += len(batch)
                if texts:
                    yield texts


def file_splits(src, validation_split_percentage=5, seed=42, keep_linebreaks=False, include_test=False):
    """{split: FileSplit} of the splits load_raw_text makes from the same options, when every one is read from
    uncompressed .txt, JSON Lines or parquet files; None when another reader is needed (--streaming, a hub dataset,
    other file types, compressed files, JSON that is not JSON Lines with a string under --text_column or "text" in
    each file's first object, parquet files of different columns: load_raw_text reads them)."""
    check_text_options(src, validation_split_percentage)
    if src.streaming or src.dataset_name:
        return None
    named = {"train": ("--train_file", src.train_file), "validation": ("--validation_file", src.validation_file),
             "test": ("--test_file", getattr(src, "test_file", None) if include_test else None)}
    splits = {}
    for split, (flag, files) in named.items():
        if files:
            files, ext = checked_files(files, flag)
            if any(f.lower().endswith(COMPRESSIONS) for f in files):
                return None
            if ext in PLAIN:
                splits[split] = FileSplit(files, flag, keep_linebreaks)
            elif ext in JSON_LINES and _json_lines_column(files, src.text_column or "text"):
                splits[split] = FileSplit(files, flag, reader="json lines", column=src.text_column or "text")
            elif ext in PARQUET and (column := _parquet_column(files, src, FileSplit(files, flag).where)):
                splits[split] = FileSplit(files, flag, reader="parquet", column=column)
            else:
                return None
    if include_test and "test" not in splits:
        raise UserError(f"--do_predict evaluates test text but {splits['train'].where} has none; pass --test_file FILE")
    if "validation" not in splits and validation_split_percentage > 0:
        train = splits["train"]
        hold_out = {"percentage": validation_split_percentage, "seed": seed}
        splits["train"] = dataclasses.replace(train, hold_out={**hold_out, "held": False})
        splits["validation"] = dataclasses.replace(train, hold_out={**hold_out, "held": True})
    return {split: splits[split] for split in ("train", "validation", "test") if split in splits}


def _json_lines_column(files, column):
    """`column` when every file is JSON Lines whose first object holds a string under it, else None."""
    for path in files:
        with open(path, "rb") as f:
            line = f.readline(FIRST_LINE_LIMIT)
            while line and not line.strip(JSON_SPACE.encode()):
                line = f.readline(FIRST_LINE_LIMIT)
        if line.startswith(b"\xef\xbb\xbf") or not isinstance((_json_object(line) or {}).get(column), str):
            return None  # a byte order mark, or no text in the first object: datasets reads it
    return column


def _parquet_column(files, src, where):
    """The text column of parquet files of one schema, chosen from it as load_raw_text chooses (a UserError when it
    cannot); None when their schemas differ (datasets reads them) or one is not parquet."""
    try:
        schemas = [pq.read_schema(path) for path in files]
    except (OSError, pa.ArrowException):
        return None  # datasets names the problem
    if any(not schema.equals(schemas[0]) for schema in schemas[1:]):
        return None
    return text_column(feature_types(datasets.Features.from_arrow_schema(schemas[0])), src, where)
