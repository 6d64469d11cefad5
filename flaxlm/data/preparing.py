"""Making a prepared directory (flaxlm.data.prepared describes it): prepare_data.py's work.

    plan = plan_jobs(raw, num_workers)                 # each split cut as the training scripts cut it
    prepare(out_dir, raw, plan, make_rows, length, about, num_workers=4)
    write_manifest(out_dir, plan, about)

The rows equal the ones the training script makes from the same text and options. Plain .txt, JSON Lines and parquet
files are read by flaxlm.data.text_ranges (the texts of load_raw_text, held-out validation lines included) in byte
ranges cut at line starts (parquet: row ranges), one per job, each job reading only its own (so a pod's hosts share
the reading; no arrow copy): one job gives the script's rows, N jobs the script's rows of each range in turn. Other
sources come from load_raw_text, their texts cut into min(workers, texts) contiguous ranges as
datasets.map(num_proc=N) cuts them (the rows of the script's --preprocessing_num_workers N). Each job calls the row
function on batches of GROUP_BATCH texts from its range's start, as datasets.map does. A job writes its rows into
shards of about shard_bytes of text each, closed at a batch boundary; a finished shard's record (.json, written
last) says where its text ends. So a rerun keeps the finished shards whose size and checksum hold, continues each
job after its last one, and ends with the same rows. Memory stays flat: one batch of texts (with their ids as int32,
tokenized rows.ENCODE_CHARS characters at a time) and one shard's open files per worker.

On a pod, every process runs the same command: the plan has workers x processes jobs per split, each process runs
its contiguous block of them (share) into the one shared out_dir, and process 0 writes the manifest once all have
finished (prepare_data.py waits for them). A job's shards are the same whichever process made them, so the rows
equal those of one process with as many workers, and a rerun with another split of the same job count continues.
"""
import concurrent.futures
import glob
import itertools
import json
import multiprocessing
import os
import queue
import time
import zlib

import datasets
import numpy as np

from flaxlm.data import prepared
from flaxlm.data.rows import GROUP_BATCH, jax_started, rows_of_batch
from flaxlm.data.text import file_list, iter_texts, one_dataset
from flaxlm.data.text_ranges import FileSplit, contiguous
from flaxlm.errors import UserError

PLAN = "prepare.json"  # the settings of a preparation under way (a rerun must have the same to continue it)


def plan_jobs(raw, num_jobs):
    """{split: [(start, end), ...]}: the ranges of each split's jobs, num_jobs of them (the workers of every
    process; fewer for a split of fewer texts): a FileSplit's ranges (bytes of its files cut at line starts, or rows
    of parquet files; a held-out validation split has the train split's), or text ranges of a Dataset; a stream's
    jobs are (None, num_jobs): each reads the whole stream and makes the rows of every num_jobs-th batch of
    GROUP_BATCH texts (a batch's rows do not depend on the others', so together they make one job's rows)."""
    plan, k = {}, num_jobs or 1
    for split, ds in raw.items():
        if isinstance(ds, FileSplit):
            plan[split] = ds.cut(k)
        elif isinstance(ds, datasets.IterableDataset):
            plan[split] = [(None, k)] * k
        else:
            plan[split] = contiguous(len(ds), k)
    return plan


def read_in_ranges(raw):
    """How the jobs read the text: "byte ranges" / "row ranges" / "byte and row ranges" when every split is a
    FileSplit (each job reading only its own range), else "datasets"."""
    if not all(isinstance(ds, FileSplit) for ds in raw.values()):
        return "datasets"
    units = sorted({ds.unit for ds in raw.values()})
    return " and ".join(unit[:-1] for unit in units) + " ranges"


def share(plan, process, processes):
    """{split: [job index, ...]}: the jobs that process `process` of `processes` runs, each split's jobs cut into
    contiguous blocks (job j of k goes to process j * processes // k). A split of fewer jobs than processes leaves
    the last processes without any of it."""
    return {split: [j for j in range(len(ranges)) if j * processes // len(ranges) == process]
            for split, ranges in plan.items()}


def describe_share(plan, jobs, raw):
    """Which jobs of the plan `jobs` (a share) holds, in words: 'train jobs 2-3 of 4, validation jobs 2-3 of 4',
    and for files read in ranges how many bytes (parquet rows) of them that is."""
    said = ", ".join(f"{split} jobs {js[0]}-{js[-1]} of {len(plan[split])}" if js else f"no {split} job"
                     for split, js in jobs.items())
    if read_in_ranges(raw) != "datasets":
        for unit in sorted({ds.unit for ds in raw.values()}):
            splits = [split for split, ds in raw.items() if ds.unit == unit]
            mine = sum(plan[split][j][1] - plan[split][j][0] for split in splits for j in jobs[split])
            every = sum(plan[split][-1][1] for split in splits)
            said += f"; it reads {mine:,} of the {every:,} {unit} of text"
    return said


def count_lines_held_out(out_dir, raw, plan, jobs):
    """Count the lines of this process's share (`jobs`) of the train ranges into out_dir, when the validation split
    is held out of train text files (which lines hold_out holds out depends on every line's index)."""
    if not _held_out_of_files(raw):
        return
    for j in jobs["train"]:
        span = plan["train"][j]
        _write_json(_lines_path(out_dir, j), {"span": list(span), "lines": raw["train"].count(span)})


def with_lines_counted(out_dir, raw, plan):
    """raw with the hold-out's line counts (count_lines_held_out's, of every process) in its FileSplits."""
    if not _held_out_of_files(raw):
        return raw
    counts = []
    for j, span in enumerate(plan["train"]):
        try:
            with open(_lines_path(out_dir, j), encoding="utf-8") as f:
                record = json.load(f)
        except FileNotFoundError:
            raise UserError(f"{out_dir} lacks the line count of train range {j}: on a multi-host run --output_dir "
                            f"must be one directory every process writes to (NFS, a mounted bucket)") from None
        assert record["span"] == list(span), (record, span)
        counts.append(record["lines"])
    return {split: ds.counted(counts) if isinstance(ds, FileSplit) and ds.hold_out else ds
            for split, ds in raw.items()}


def _held_out_of_files(raw):
    """Whether the validation split is held out of train text files (read in byte ranges)."""
    return isinstance(raw.get("validation"), FileSplit) and bool(raw["validation"].hold_out)


def _lines_path(out_dir, job):
    return os.path.join(out_dir, f"lines-train-{job:03d}.json")


def settings_changed(before, now):
    """What differs between two plans (start_or_continue's `about`), in words, each naming what changed: a setting
    (rows: length 512 -> 1024), a source file added, gone or changed (sources: --validation_file v.txt added), or the
    job count (workers x processes). The jobs' ranges follow from the sources, so they are named only when nothing
    else explains them."""
    said = []
    for part in sorted((set(before) | set(now)) - {"sources", "jobs"}):
        old, new = _leaves(before.get(part)), _leaves(now.get(part))
        said += [f"{part}: {key or part} {old.get(key)} -> {new.get(key)}"
                 for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
    old, new = ({s.get("path") or s.get("dataset"): s for s in plan.get("sources", [])} for plan in (before, now))
    for name in sorted(set(old) | set(new)):
        what = f"--{(new.get(name) or old.get(name)).get('flag', 'dataset_name')} {name}"
        if name not in old or name not in new:
            said.append(f"sources: {what} {'added' if name in new else 'no longer given'}")
        elif old[name] != new[name]:
            said.append(f"sources: {what} changed since (its size or modification time)")
    jobs_before, jobs_now = before.get("jobs", {}), now.get("jobs", {})
    counts = ({split: len(ranges) for split, ranges in jobs.items()} for jobs in (jobs_before, jobs_now))
    counts_before, counts_now = counts
    if counts_before != counts_now and set(counts_before) == set(counts_now):
        said.append(f"jobs: {counts_before} -> {counts_now} per split (--preprocessing_num_workers x processes)")
    elif jobs_before != jobs_now and not said:
        said.append("jobs: the text's ranges (the source text changed)")
    return said or ["the plan file differs"]


def _leaves(value, prefix=""):
    """{dotted key: value} of a nested mapping's leaves ({"": value} for a leaf)."""
    if not isinstance(value, dict):
        return {prefix: value}
    out = {}
    for key, inner in value.items():
        out.update(_leaves(inner, f"{prefix}.{key}" if prefix else key))
    return out


def check_output_dir(out_dir):
    """UserError when out_dir holds files but no preparation (nothing of the user's is overwritten)."""
    if os.path.isfile(out_dir):
        raise UserError(f"--output_dir {out_dir} is a file; pass a new or empty directory")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not os.path.isfile(os.path.join(out_dir, PLAN)):
        raise UserError(f"--output_dir {out_dir} is not empty and holds no preparation under way; pass a new or "
                        f"empty directory")


def describe_sources(source):
    """The text sources a manifest records: each file with its size and mtime, or the hub dataset's name."""
    if source.dataset_name:
        name, config = one_dataset(source)
        out = [{"dataset": name, "config": config}]
    else:
        out = []
    for flag in ("train_file", "validation_file", "test_file"):
        for path in file_list(getattr(source, flag) or [], f"--{flag}"):
            stat = os.stat(path)
            out.append({"flag": flag, "path": os.path.abspath(path), "size": stat.st_size, "mtime": stat.st_mtime})
    return out


def summary(out_dir, manifest):
    """One line per split: rows, tokens and bytes per token of the prepared directory."""
    itemsize = np.dtype(manifest["rows"]["dtype"]).itemsize
    lines = [f"prepared rows of {manifest['rows']['length']} tokens ({manifest['rows']['function']}, "
             f"{np.dtype(manifest['rows']['dtype']).name}) in {out_dir}:"]
    for split, shards in manifest["splits"].items():
        rows = sum(s["rows"] for s in shards)
        data = rows * manifest["rows"]["length"] * itemsize * len(manifest["rows"]["columns"])
        lines.append(f"  {split}: {rows:,} rows in {len(shards)} shards, {data / 1e6:.1f} MB "
                     f"({data / max(1, rows * manifest['rows']['length']):.2f} bytes per token)")
    return "\n".join(lines)


def start_or_continue(out_dir, about, write=True):
    """Write the plan `about` to out_dir (new, or empty), or check that the preparation under way there has the
    same one; a UserError for another directory's files or other settings. With write=False only the check (the
    processes of a pod check, then process 0 writes)."""
    path = os.path.join(out_dir, PLAN)
    about = json.loads(json.dumps(about))  # as JSON gives it back: tuples are lists
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            before = json.load(f)
        if before != about:
            raise UserError(f"--output_dir {out_dir} holds rows prepared with other settings ("
                            f"{'; '.join(settings_changed(before, about))}); pass a new --output_dir, or the settings "
                            f"it was made with")
        return
    check_output_dir(out_dir)
    if not write:
        return
    os.makedirs(out_dir, exist_ok=True)
    _write_json(path, about)


def prepare(out_dir, raw, plan, make_rows, length, about, *, num_workers=None, shard_bytes=256 << 20, jobs=None):
    """Run the jobs of `plan` (only those of `jobs`, {split: [job index, ...]}, when given: a process's share) in
    num_workers processes."""
    jobs = share(plan, 0, 1) if jobs is None else jobs
    dtype = prepared.row_dtype(about["tokenizer"]["vocab_size"])
    todo = [dict(out_dir=out_dir, split=split, job=j, start=plan[split][j][0], end=plan[split][j][1], length=length,
                 dtype=dtype.str, columns=about["rows"]["columns"], shard_bytes=shard_bytes)
            for split, indices in jobs.items() for j in indices]
    whole = sum(map(len, jobs.values())) == sum(map(len, plan.values()))
    progress = Throughput(_total_bytes(about["sources"]) if whole else None)
    if (num_workers or 1) < 2 or len(todo) == 1:
        for job in todo:
            run_job(job, raw[job["split"]], make_rows, progress.report)
    else:
        _run_in_pool(todo, raw, make_rows, num_workers, progress)
    progress.close()


def write_manifest(out_dir, plan, about):
    """The manifest of the finished shards of every job of `plan` (whichever process made them), written to
    out_dir and returned; a UserError when a job's shards are not all there."""
    splits = {}
    for split, ranges in plan.items():
        records = [finished_shards(out_dir, split, j) for j in range(len(ranges))]
        unfinished = [j for j, job in enumerate(records) if not (job and job[-1]["last"])]
        if unfinished:
            raise UserError(f"{out_dir} lacks finished shards of {split} job(s) {unfinished}: on a multi-host run "
                            f"--output_dir must be one directory every process writes to (NFS, a mounted bucket); "
                            f"run the same command on every host again to finish them")
        if not sum(job[-1]["end_text"] for job in records):
            raise UserError(f"the {split} split holds no text (every line is blank); pass a source with text")
        splits[split] = [record for job in records for record in job]
    manifest = {"format": prepared.FORMAT, "version": prepared.VERSION, **about,
                "rows": {**about["rows"], "dtype": prepared.row_dtype(about["tokenizer"]["vocab_size"]).str},
                "splits": splits}
    _write_json(os.path.join(out_dir, prepared.MANIFEST), manifest)
    return manifest


def _run_in_pool(jobs, raw, make_rows, num_workers, progress):
    """The jobs in num_workers processes (forked; spawned once JAX runs, whose threads a fork can deadlock),
    reporting through a queue."""
    context = multiprocessing.get_context("spawn" if jax_started() else "fork")
    with context.Manager() as manager:
        reports = manager.Queue()
        with concurrent.futures.ProcessPoolExecutor(num_workers, mp_context=context) as pool:
            futures = [pool.submit(run_job, job, raw[job["split"]], make_rows, reports.put) for job in jobs]
            while not all(f.done() for f in futures):
                try:
                    progress.report(reports.get(timeout=0.5))
                except queue.Empty:
                    pass
            for f in futures:
                f.result()  # a job's error (a UserError too) is raised here
            while not reports.empty():
                progress.report(reports.get())


def run_job(job, ds, make_rows, report):
    """One job: the rows of texts [start, end) of a split (or of a whole stream), in shards, after the finished
    shards it keeps; report((text bytes, tokens)) after each batch."""
    done = finished_shards(job["out_dir"], job["split"], job["job"], check=job)
    if done and done[-1]["last"]:
        return
    part, skip = len(done), done[-1]["end_text"] if done else 0
    shard = _ShardWriter(job, part, skip)
    for texts in _text_batches(ds, job, skip):
        if shard.text_bytes >= job["shard_bytes"]:  # full, and more text follows
            shard.finish(last=False)
            shard = _ShardWriter(job, shard.part + 1, shard.end_text)
        shard.add(rows_of_batch({"text": texts}, make_rows, job["length"]), texts)
        report((shard.batch_bytes, shard.batch_tokens))
    shard.finish(last=True)


def _text_batches(ds, job, skip):
    """Batches of GROUP_BATCH texts of the job's range of ds (a stream: its every end-th batch) from the skip-th
    text on (a multiple of GROUP_BATCH)."""
    start, end = job["start"], job["end"]
    if isinstance(ds, FileSplit):
        pending, skipped = [], 0
        for texts in ds.texts((start, end), job["job"]):
            if skipped < skip:  # texts the finished shards hold
                drop = min(len(texts), skip - skipped)
                texts, skipped = texts[drop:], skipped + drop
            pending.extend(texts)
            full = len(pending) - len(pending) % GROUP_BATCH
            for a in range(0, full, GROUP_BATCH):
                yield pending[a:a + GROUP_BATCH]
            pending = pending[full:]
        if pending:
            yield pending
        return
    if start is None:
        for i, texts in enumerate(itertools.islice(iter_texts(ds, GROUP_BATCH), job["job"], None, end)):
            if i * GROUP_BATCH >= skip:
                yield texts
        return
    for a in range(start + skip, end, GROUP_BATCH):
        yield ds[a:min(a + GROUP_BATCH, end)]["text"]


class _ShardWriter:
    """One shard being written: its columns appended batch by batch to .tmp files, renamed and recorded by finish."""

    def __init__(self, job, part, start_text):
        self.job, self.part, self.end_text = job, part, start_text
        self.name = shard_name(job["split"], job["job"], part)
        self.dtype = np.dtype(job["dtype"])
        self.files = {c: open(self._path(c) + ".tmp", "wb") for c in job["columns"]}
        self.crc = {c: 0 for c in job["columns"]}
        self.rows = self.text_bytes = self.tokens = self.batch_bytes = self.batch_tokens = 0

    def add(self, columns, texts):
        self.batch_bytes = sum(len(t.encode("utf-8")) for t in texts)
        self.batch_tokens = int(columns["input_ids"].size)
        limit = np.iinfo(self.dtype).max
        for column, rows in columns.items():
            if rows.size and (rows.min() < 0 or rows.max() > limit):
                raise UserError(f"a token id outside [0, {limit}] in the {column} rows; the tokenizer's ids must be "
                                f"below its vocabulary size")
            data = np.ascontiguousarray(rows, dtype=self.dtype).reshape(-1).view(np.uint8)  # no bytes copy
            self.files[column].write(data)
            self.crc[column] = zlib.crc32(data, self.crc[column])
        self.rows += len(columns["input_ids"])
        self.text_bytes += self.batch_bytes
        self.tokens += self.batch_tokens
        self.end_text += len(texts)

    def finish(self, last):
        """Data files complete and renamed, then the record that marks the shard finished."""
        for column, f in self.files.items():
            f.flush()
            os.fsync(f.fileno())
            f.close()
            os.replace(self._path(column) + ".tmp", self._path(column))
        record = {"name": self.name, "rows": self.rows, "crc32": self.crc, "end_text": self.end_text,
                  "text_bytes": self.text_bytes, "tokens": self.tokens, "last": last}
        _write_json(self._path("json"), record)

    def _path(self, suffix):
        return os.path.join(self.job["out_dir"], f"{self.name}.{suffix}")


def shard_name(split, job, part):
    return f"{split}-{job:03d}-{part:05d}"


def finished_shards(out_dir, split, job, check=None):
    """The records of a job's finished shards, in order; with `check` (the job), only those before the first whose
    files fail their size or checksum check (its record and the later ones are removed: they are made again)."""
    paths = sorted(glob.glob(os.path.join(out_dir, shard_name(split, job, 0)[:-5] + "*.json")))
    records = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        if check:
            problem = prepared.shard_problem(out_dir, record, check["length"], np.dtype(check["dtype"]),
                                             check["columns"])
            if problem:
                print(f"note: {problem}; making it again", flush=True)
                for later in paths[len(records):]:
                    os.remove(later)
                break
        records.append(record)
    return records


def _write_json(path, value):
    """Written whole or not at all: a .tmp file renamed."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def _total_bytes(sources):
    sizes = [s.get("size") for s in sources]
    return sum(sizes) if sizes and None not in sizes else None


class Throughput:
    """The progress bar of a preparation: text read (MB/s) and tokens made (tokens/s), over every worker."""

    def __init__(self, total_bytes):
        from tqdm.auto import tqdm
        self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="Preparing rows", mininterval=1.0)
        self.t0, self.tokens = time.perf_counter(), 0

    def report(self, batch):
        text_bytes, tokens = batch
        self.tokens += tokens
        self.bar.update(text_bytes)
        self.bar.set_postfix_str(f"{self.tokens / max(time.perf_counter() - self.t0, 1e-9):,.0f} tokens/s",
                                 refresh=False)

    def close(self):
        self.bar.close()
        seconds = time.perf_counter() - self.t0
        print(f"prepared {self.bar.n / 1e6:.1f} MB of text into {self.tokens:,} row tokens in {seconds:.1f} s "
              f"({self.bar.n / 1e6 / max(seconds, 1e-9):.1f} MB/s, {self.tokens / max(seconds, 1e-9):,.0f} "
              f"tokens/s)", flush=True)
