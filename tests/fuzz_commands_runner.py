"""Worker of test_fuzz_commands.py: run every command on mutated copies of the fuzz datasets.

Run as ``python fuzz_commands_runner.py BASE FAMILY SEED FIRST COUNT``. BASE is a tree ``fuzz_cases.build_base``
wrote; it is copied once, and for each case ``FIRST .. FIRST + COUNT - 1`` the copy is mutated
(``fuzz_cases.mutate_case``), every command is run on the datasets the case names, and the copy is restored.
Like corruption_reader.py it prints ``BEGIN i`` before and ``END i JSON`` after each case, flushing each line,
so that the parent knows which case was running if this process dies or hangs. The JSON has the mutation
(``what``) and, per dataset and command, the outcome (a first line ``BASE JSON`` has the outcomes on the datasets
unmutated):

* ``ok``: it succeeded, and what it read is right: every pack ``PackedDataset`` gives equals a reference built
  from the files with bounds-checked Python indexing (corruption_reader.reference), and the Megatron export
  holds the reference's tokens;
* ``refused``: a ``PackfmtError`` (the only exception allowed) whose ``file`` and ``field`` are recorded;
* ``BAD ...``: any other exception, a wrong item, a case past its time limit.

``validate`` (structural and deep) must return a report, never raise: its verdicts are ``valid``/``invalid``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from packfmt import format as F
from packfmt.errors import PackfmtError

from corruption_reader import OutOfRange, reference
from fuzz_cases import FAMILIES, mutate_case

CASE_LIMIT_S = 120
COMMANDS = ("validate", "validate_deep", "open", "inspect", "pack", "export_megatron", "export_webdataset")


class CaseTimeout(BaseException):
    pass


def _expired(signum, frame):
    raise CaseTimeout(f"past {CASE_LIMIT_S} s")


# ----------------------------------------------------------------------------- the reference, from the files
def _members(ds: Path, doc: dict) -> list[Path]:
    if doc["format"] == F.FORMAT_NAME:
        return [ds]
    if doc["members"] == "table":
        text = (ds / "member_names.txt").read_bytes().decode("utf-8")
        return [ds / line.split("\t")[1] for line in text.split("\n")[:-1]]
    return [ds / m["path"] for m in doc["members"]]


def reference_store(ds: Path) -> SimpleNamespace:
    """The dataset's tokens, loss mask (None without) and document offsets, read from its files and its
    members' as the spec lays them out (no packfmt reader involved)."""
    doc = json.loads((ds / F.MANIFEST).read_bytes())
    tokens, masks, offsets = [], [], [np.zeros(1, dtype=np.int64)]
    for member in _members(ds, doc):
        own = json.loads((member / F.MANIFEST).read_bytes())
        t = np.fromfile(member / F.TOKENS, dtype=F.TOKEN_DTYPES[own["token_dtype"]]).astype(np.int64)
        o = np.fromfile(member / F.DOC_OFFSETS, dtype=F.OFFSET_DTYPE)
        tokens.append(t)
        masks.append(np.fromfile(member / F.LOSS_MASK, dtype=F.MASK_DTYPE) if own["loss_mask"]
                     else np.ones(t.shape[0], dtype=F.MASK_DTYPE))
        offsets.append(o[1:] - o[0] + offsets[-1][-1] if o.size else o)
    return SimpleNamespace(tokens=np.concatenate(tokens), loss_mask=np.concatenate(masks) if doc["loss_mask"] else None,
                           doc_offsets=np.concatenate(offsets), token_dtype=doc["token_dtype"])


def reference_index(ds: Path, name: str, token_dtype: str) -> SimpleNamespace:
    folder = ds / F.PACKS_DIR / name
    doc = json.loads((folder / F.PACK_INDEX_JSON).read_bytes())
    segs = np.fromfile(folder / F.SEGMENTS, dtype=F.OFFSET_DTYPE)
    out = SimpleNamespace(pack_offsets=np.fromfile(folder / F.PACK_OFFSETS, dtype=F.OFFSET_DTYPE),
                          segments=segs[:segs.size - segs.size % 3].reshape(-1, 3),
                          pack_token_offsets=None, packed_tokens=None, packed_loss_mask=None)
    if doc["materialized"]:
        out.pack_token_offsets = np.fromfile(folder / F.PACK_TOKEN_OFFSETS, dtype=F.OFFSET_DTYPE)
        out.packed_tokens = np.fromfile(folder / F.PACKED_TOKENS, dtype=F.TOKEN_DTYPES[token_dtype])
        if (folder / F.PACKED_LOSS_MASK).exists():
            out.packed_loss_mask = np.fromfile(folder / F.PACKED_LOSS_MASK, dtype=F.MASK_DTYPE)
    return out


# ----------------------------------------------------------------------------- the commands
def _open_and_read(ds: Path, out: Path) -> None:
    """``packfmt.open``, every document, and every pack of every index through ``PackedDataset``, compared with
    the reference."""
    import packfmt
    from packfmt.torch import PackedDataset

    store = packfmt.open(ds)
    for d in range(store.num_documents):
        store.document(d)
    names = store.pack_index_names()
    if not names:
        return
    ref = reference_store(ds)
    for name in names:
        ds_ = PackedDataset(store, name)
        items = [ds_[p] for p in range(len(ds_))]
        batch = ds_.__getitems__(list(range(len(ds_)))) if len(ds_) else []
        index = reference_index(ds, name, ref.token_dtype)
        for p, item in enumerate(items):
            try:
                want = reference(ref, index, p)
            except (OutOfRange, IndexError, ValueError) as exc:
                raise AssertionError(f"the reader accepted pack {p} of {name}, which the reference cannot read: {exc}")
            got = (item["input_ids"].tolist(), item["labels"].tolist())
            if got != want or (batch[p]["input_ids"].tolist(), batch[p]["labels"].tolist()) != want:
                raise AssertionError(f"pack {p} of index {name!r} differs from the reference built from the files")


def _inspect(ds: Path, out: Path) -> None:
    import packfmt
    from packfmt.inspect import format_summary, summarize
    from packfmt.render import format_pack

    store = packfmt.open(ds)
    summary = summarize(store)
    json.dumps(summary, sort_keys=True)  # --json
    format_summary(summary)
    for name in store.pack_index_names():  # --show-pack, first and last
        index = store.pack_index(name)
        for p in {0, index.num_packs - 1} - {-1}:
            format_pack(index, p, None)


def _pack(ds: Path, out: Path) -> None:
    import packfmt
    from packfmt.collection.shards import write_shards
    from packfmt.packindex import build_pack_index

    store = packfmt.open(ds)
    names = store.pack_index_names()
    try:
        if names:  # --shards, from an index the dataset has
            write_shards(store, names[0], out / "shards", shard_bytes=100)
    finally:
        build_pack_index(ds, capacity=24, name="fuzz", algorithm="bfd")


def _export_megatron(ds: Path, out: Path) -> None:
    from packfmt.megatron import export_megatron

    bin_path, _ = export_megatron(ds, out / "mg")
    ref = reference_store(ds)
    dtype = np.dtype("<u2") if ref.token_dtype == "uint16" else np.dtype("<i4")
    if not np.array_equal(np.fromfile(bin_path, dtype=dtype).astype(np.int64), ref.tokens):
        raise AssertionError("the Megatron export's tokens differ from the dataset's")


def _export_webdataset(ds: Path, out: Path) -> None:
    import packfmt
    from packfmt.export_webdataset import export_webdataset

    names = packfmt.open(ds).pack_index_names()
    if names:
        export_webdataset(ds, out / "wds", index=names[-1])


def _validate(ds: Path, deep: bool) -> str:
    from packfmt.validate import validate

    report = validate(ds, deep=deep)
    for p in report.problems:
        if not p.file:
            raise AssertionError(f"a problem names no file: {p.message}")
    return "valid" if report.ok else "invalid: " + (report.errors[0].message[:200] if report.errors else "")


STEPS = {"open": _open_and_read, "inspect": _inspect, "pack": _pack, "export_megatron": _export_megatron,
         "export_webdataset": _export_webdataset}


def _outcome(fn, *args) -> str:
    try:
        result = fn(*args)
        return result if isinstance(result, str) else "ok"
    except PackfmtError as exc:
        if not exc.file or not exc.field:
            return f"BAD {type(exc).__name__} without file or field: file={exc.file!r} field={exc.field!r}: {exc}"[:600]
        return f"refused {type(exc).__name__} file={exc.file} field={exc.field}: {exc}"[:400]
    except CaseTimeout:
        raise
    except BaseException as exc:  # noqa: BLE001  (anything else is the finding)
        tb = traceback.format_exc().strip().splitlines()
        return f"BAD {type(exc).__name__}: {exc} | {' / '.join(tb[-5:])}".replace("\n", " ")[:1200]


def run_commands(path: Path, out: Path) -> dict[str, str]:
    """The outcome of every command on the dataset at ``path`` (``out``: a scratch folder, emptied after each)."""
    got = {"validate": _outcome(_validate, path, False), "validate_deep": _outcome(_validate, path, True)}
    for name, fn in STEPS.items():
        got[name] = _outcome(fn, path, out)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
    return got


def run_case(work: Path, out: Path, family: str, seed: int, i: int) -> dict:
    what, datasets, keeps = mutate_case(work, family, i, seed)
    return {"what": what, "keeps": keeps, "datasets": {ds: run_commands(work / ds, out) for ds in datasets}}


# ----------------------------------------------------------------------------- restoring the copy
class Pristine:
    """The copy's files as they were: restore() rewrites what changed and removes what was added."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
        self.dirs = {p for p in root.rglob("*") if p.is_dir()}
        self.stat = {p: self._stat(p) for p in self.files}

    @staticmethod
    def _stat(p: Path):
        s = p.stat()
        return s.st_size, s.st_mtime_ns

    def restore(self) -> None:
        for p in sorted(self.root.rglob("*"), reverse=True):
            if p.is_dir() and not p.is_symlink():
                if p not in self.dirs:
                    shutil.rmtree(p)
            elif p not in self.files:
                p.unlink()
        for d in sorted(self.dirs):
            d.mkdir(exist_ok=True)
        for p, data in self.files.items():
            if not p.exists() or self._stat(p) != self.stat[p]:
                p.write_bytes(data)
                self.stat[p] = self._stat(p)


def main(base: str, family: str, seed: int, first: int, count: int) -> None:
    signal.signal(signal.SIGALRM, _expired)
    # every write here is into a scratch copy restored after the case: its durability is not under test, and an
    # fsync per published file (pack, export) was a third of a case on a busy disk
    os.fsync = lambda fd: None
    with tempfile.TemporaryDirectory(prefix="fuzz-commands-") as tmp:
        work, out = Path(tmp) / "work", Path(tmp) / "out"
        shutil.copytree(base, work)
        out.mkdir()
        pristine = Pristine(work)
        datasets = sorted({ds for target in FAMILIES[family] for ds in target[3]})
        print("BASE " + json.dumps({ds: run_commands(work / ds, out) for ds in datasets}), flush=True)
        pristine.restore()
        for i in range(first, first + count):
            print(f"BEGIN {i}", flush=True)
            signal.alarm(CASE_LIMIT_S)
            try:
                result = run_case(work, out, family, seed, i)
            except CaseTimeout as exc:
                result = {"what": "?", "datasets": {"?": {"case": f"BAD hang: {exc}"}}}
            finally:
                signal.alarm(0)
            print(f"END {i} {json.dumps(result)}", flush=True)
            pristine.restore()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
