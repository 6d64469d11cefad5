"""Plain text files read in byte ranges cut at line ends: prepare_data.py's jobs each read only their own piece,
so the hosts of a pod share the reading as they share the tokenizing, and no copy of the text is made (`datasets`'
arrow copy costs ~4.5 bytes per token of disk and a pass over the whole corpus on every host).

    spans = cut(files, 4)                                  # 4 (start, end) ranges of the files' bytes, end to end
    for lines in read_lines(files, spans[0], "--train_file"):
        ...                                                # lists of that range's lines, blank ones too
    n = count_lines(files, spans[0])                       # how many lines that is, without decoding them

The lines are those of `datasets`' "text" builder, which load_raw_text uses: UTF-8, "\\r\\n" and "\\r" read as
"\\n", one text per "\\n", the line break kept with keep_linebreaks. Bytes that are not UTF-8 are a UserError
naming the file and line. A range starts at the start of a line (a file's start, or the byte after a "\\n"), so
the ranges' lines, in order, are the files' lines.
"""
import dataclasses
import os

import numpy as np

from flaxlm.data.text import (COMPRESSIONS, check_text_options, checked_files, held_out_count, held_out_mask)
from flaxlm.errors import UserError, decode_utf8_line

PLAIN = (".txt", ".text")  # the extensions read here (uncompressed)

BLOCK = 8 << 20  # bytes read at a time (and then to the end of their line)


def cut(files, k):
    """Up to k (start, end) ranges covering the files' bytes (laid end to end, in order), each of about
    1/k of them and starting at a line's start; fewer when lines are longer than a range."""
    ends = _file_ends(files)
    bounds = sorted({0, ends[-1], *(_line_start(files, ends, ends[-1] * i // k) for i in range(1, k))})
    return list(zip(bounds[:-1], bounds[1:]))


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


def count_lines(files, span):
    """The number of lines read_lines gives for span, counted in the bytes ("\\r" and "\\n" are never part of a
    longer UTF-8 sequence)."""
    count = 0
    for path, start, end in _pieces(files, span):
        block = b""
        for _, block in _blocks(path, start, end):
            if b"\r" in block:
                block = block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            count += block.count(b"\n")
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
    start, end = span
    begin = 0
    for path in files:
        size = os.path.getsize(path)
        a, b = max(start, begin), min(end, begin + size)
        if a < b:
            yield path, a - begin, b - begin
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


def _raise_not_utf8(path, where, offset, block, bad):
    """The UserError naming the file and line of the bytes that are not UTF-8 at block[bad] (block at offset)."""
    line_start = block.rfind(b"\n", 0, bad) + 1
    line_end = block.find(b"\n", bad)
    before = block.count(b"\n", 0, line_start)
    with open(path, "rb") as f:  # the lines before the block: counted only now, once reading failed
        left = offset
        while left > 0 and (chunk := f.read(min(BLOCK, left))):
            before += chunk.count(b"\n")
            left -= len(chunk)
    decode_utf8_line(block[line_start:None if line_end < 0 else line_end], f"{where} {path}", before + 1)
    raise UserError(f"{where} {path} is not UTF-8 text (line {before + 1}); convert the file to UTF-8 (e.g. iconv -f "
                    f"latin1 -t utf-8)")


@dataclasses.dataclass
class FileSplit:
    """A split of load_raw_text's read from plain text files, range by range: its texts are the non-blank lines,
    and with hold_out ({"percentage", "seed", "held"}) those hold_out keeps for training (held False) or holds out
    (held True), once counted() has given it the lines of every range."""
    files: list
    flag: str  # the flag that named the files ("--train_file"), for errors
    keep_linebreaks: bool = False
    hold_out: dict = None

    @property
    def where(self):
        return f"{self.flag} {', '.join(self.files)}"

    def counted(self, lines_per_span):
        """This split with the hold-out's counts: how many lines each range (of the plan, in order) holds."""
        n = sum(lines_per_span)
        n_val = held_out_count(n, self.hold_out["percentage"], self.where)
        firsts = np.concatenate([[0], np.cumsum(lines_per_span)[:-1]]).tolist()
        return dataclasses.replace(self, hold_out={**self.hold_out, "n": n, "n_val": n_val, "first_lines": firsts})

    def texts(self, span, job):
        """Lists of the split's texts in range span (the plan's job-th)."""
        index = self.hold_out["first_lines"][job] if self.hold_out else 0
        for lines in read_lines(self.files, span, self.flag, self.keep_linebreaks):
            if self.hold_out:
                h = self.hold_out
                held = held_out_mask(index, len(lines), h["n"], h["n_val"], h["seed"])
                index += len(lines)
                lines = [t for t, out in zip(lines, held) if out == h["held"]]
            yield [t for t in lines if t and not t.isspace()]


def file_splits(src, validation_split_percentage=5, seed=42, keep_linebreaks=False, include_test=False):
    """{split: FileSplit} of the splits load_raw_text makes from the same options, when every one is read from
    uncompressed .txt files; None when another reader is needed (--streaming, a hub dataset, other file types,
    compressed files: load_raw_text reads them)."""
    check_text_options(src, validation_split_percentage)
    if src.streaming or src.dataset_name:
        return None
    named = {"train": ("--train_file", src.train_file), "validation": ("--validation_file", src.validation_file),
             "test": ("--test_file", getattr(src, "test_file", None) if include_test else None)}
    splits = {}
    for split, (flag, files) in named.items():
        if files:
            files, ext = checked_files(files, flag)
            if ext not in PLAIN or any(f.lower().endswith(COMPRESSIONS) for f in files):
                return None
            splits[split] = FileSplit(files, flag, keep_linebreaks)
    if include_test and "test" not in splits:
        raise UserError(f"--do_predict evaluates test text but {splits['train'].where} has none; pass --test_file FILE")
    if "validation" not in splits and validation_split_percentage > 0:
        train = splits["train"]
        hold_out = {"percentage": validation_split_percentage, "seed": seed}
        splits["train"] = dataclasses.replace(train, hold_out={**hold_out, "held": False})
        splits["validation"] = dataclasses.replace(train, hold_out={**hold_out, "held": True})
    return {split: splits[split] for split in ("train", "validation", "test") if split in splits}
