"""Per-member cost of a collection: open / pack / validate (structural) of one store against the same
documents split into many members, side by side in one run.

Cases (``MEMBERSxDOCS``, documents per member): 10^3 and 10^4 tiny members of 2 documents (the fixed cost
of a member), and 10^3 members of 1,000 documents (10^6 documents: the issue's "pack over 1,000 members
<= 1.2x one store"); ``--full`` adds 10^5 tiny members. Each case runs in this process (warm page cache,
imports and numba compiled before any timing): ``packfmt.open`` + ``doc_lengths`` (what every command
needs of a dataset), ``build_pack_index`` (ffd, capacity 256) and ``packfmt.validate`` (structural).
Best of ``--repeat``; ratios are to the one store. For a member table, ``coll_table_check_s`` is reading
and checking the table alone (the part of the open a store has no counterpart of) and ``table_check_ratio``
that over the store's whole open. ``coll_manifests_read_s`` is reading every member's manifest alone and
``coll_member_files_s`` every system call a structural validate makes of a member (manifest, sizes, offsets) in
plain Python: the floors of validate's per-member cost. ``--syscalls`` counts them (``strace -f -c``): the system
calls of one structural validate per member, beyond the store's (``validate_syscalls_per_member``). ``--process`` also times each command as a
whole process (``open``: a process that opens the data set and reads its lengths). Members are written by
``packfmt.torch.testing.write_split_stores``. ``--forms array,table``: the same members listed as the manifest's
JSON array (collection format 1.3) and as a member table (2.0, spec/COLLECTION.md §2.5), side by side.

    python benchmarks/bench_members.py [--cases 1000x2,10000x2,1000x1000] [--repeat 3] [--full] [--forms array,table]
        [--syscalls] [--process] [--reuse DIR] [--out NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, best_of, machine_info, print_table, write_json  # noqa: E402

import packfmt  # noqa: E402
from packfmt import format as F  # noqa: E402
from packfmt.collection import write_collection  # noqa: E402
from packfmt.collection.manifest import collection_reader  # noqa: E402
from packfmt.collection.member_table import read_table  # noqa: E402
from packfmt.packindex import build_pack_index  # noqa: E402
from packfmt.torch.testing import write_flat_dataset, write_split_stores  # noqa: E402
from packfmt.validate import validate  # noqa: E402

CAPACITY = 256
#: The environment of every child process: the packfmt this process imported (``-P``: not the working directory's).
CHILD_ENV = dict(os.environ, PYTHONPATH=str(Path(packfmt.__file__).resolve().parents[1]))


def make(root: Path, members: int, per_member: int, forms: list[str]) -> tuple[Path, dict[str, Path]]:
    """One store and, per form, a collection of ``members`` members holding the same documents."""
    rng = np.random.default_rng(0)
    n_docs = members * per_member
    lengths = rng.integers(1, 50, n_docs).astype(np.int64)
    offsets = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.uint16)
    write_flat_dataset(root / "single", tokens, offsets, vocab_size=50_000)
    paths = write_split_stores(root / "stores", tokens, offsets, np.arange(0, n_docs + 1, per_member), vocab_size=50_000)
    out = {}
    for form in forms:  # None: the writer's own choice (a table from 1,024 members on)
        table = {"array": False, "table": True, "auto": None}[form]
        out[form] = write_collection(root / f"coll-{form}", [(None, p) for p in paths], member_table=table).path
    return root / "single", out


def measure(path: Path, repeat: int) -> dict:
    def open_():
        packfmt.open(path).doc_lengths

    def pack():
        build_pack_index(path, capacity=CAPACITY, algorithm="ffd", name="b", overwrite=True)

    def check():
        report = validate(path)
        assert report.ok, report.problems[:3]

    return {"open_s": best_of(open_, repeat), "pack_s": best_of(pack, repeat), "validate_s": best_of(check, repeat)}


def measure_table(path: Path, repeat: int) -> float | None:
    """Reading and checking the member table alone (``read_table``: both files hashed, C1 of every entry), the floor
    of a 2.0 collection's open: what it costs beyond the store's; None for a collection whose members are an array."""
    obj = json.loads((path / F.MANIFEST).read_bytes())
    if obj.get("members") != "table":
        return None
    files, read, count = F.parse_files_table(obj, file=F.MANIFEST), collection_reader(path), obj["counts"]["members"]
    return best_of(lambda: read_table(read, files, count), repeat)


def measure_manifest_floor(path: Path, repeat: int) -> float:
    """Reading every member's ``manifest.json`` (open, read, close: three system calls), the least any check of
    every member does (C3 hashes each one): the floor of a collection's structural validate, which a store of the
    same documents does not pay."""

    coll = packfmt.open(path)
    names = [os.path.join(str(path), p, F.MANIFEST) for p in coll.members.paths]

    def read_all():
        for name in names:
            fd = os.open(name, os.O_RDONLY)
            try:
                os.read(fd, 1 << 16)
            finally:
                os.close(fd)

    return best_of(read_all, repeat)


def measure_member_files_floor(path: Path, repeat: int) -> float:
    """The system calls a structural validate makes of every member and nothing else: its ``manifest.json`` read
    (open, read, close), each other listed file's size (``stat``) and its ``doc_offsets.bin`` read (V13): seven for a
    member without a loss mask, in plain Python with every path made beforehand: the floor of checking each member
    once (C2, C3), which a store of the same documents (three files) does not pay."""

    coll = packfmt.open(path)
    dirs = [os.path.join(str(path), p, "") for p in coll.members.paths]
    sizes = ((coll.members.documents + 1) * F.OFFSET_DTYPE.itemsize + 1).tolist()
    stated = [n for n in os.listdir(dirs[0]) if n not in (F.MANIFEST, F.DOC_OFFSETS)]  # every member: one writer's
    flags = os.O_RDONLY | os.O_NONBLOCK

    def read_all():
        for d, size in zip(dirs, sizes):
            fd = os.open(d + F.MANIFEST, flags)
            os.read(fd, 1 << 14)
            os.close(fd)
            for name in stated:
                os.stat(d + name)
            fd = os.open(d + F.DOC_OFFSETS, flags)
            os.read(fd, size)
            os.close(fd)

    return best_of(read_all, repeat)


#: ``--syscalls``: a process that validates the data set (structural) once, or twice: the difference is what one
#: validate of it costs with every import made and every numba kernel loaded.
VALIDATE_TIMES = ("import sys, packfmt; from packfmt.validate import validate\n"
                  "for _ in range(int(sys.argv[2])):\n    assert validate(sys.argv[1]).ok")


def count_syscalls(path: Path, times: int) -> dict[str, int]:
    """System calls (name -> calls, and ``total``) of a process running ``VALIDATE_TIMES`` on ``path``, counted by
    ``strace -f -c`` (every thread; the counts are exact, the times under strace are not used)."""
    import subprocess

    with tempfile.NamedTemporaryFile(prefix="bench_members_strace_", suffix=".txt") as out:
        subprocess.run(["strace", "-f", "-c", "-o", out.name, sys.executable, "-P", "-c", VALIDATE_TIMES, str(path),
                        str(times)], check=True, stdout=subprocess.DEVNULL, env=CHILD_ENV)
        lines = Path(out.name).read_text().splitlines()
    counts = {}
    for line in lines:  # "% time  seconds  usecs/call  calls  [errors]  syscall", then a "total" line
        parts = line.split()
        if len(parts) >= 5 and parts[3].isdigit():
            counts[parts[-1]] = int(parts[3])
    return counts


def measure_syscalls(store: Path, coll: Path, members: int) -> dict:
    """System calls of one structural validate per member of the collection, beyond the store's: each process
    validates once and twice, and the second validate's calls (twice minus once: no imports, no kernel loads) of the
    collection less the store's, over the members. Also the same per call name (the largest five)."""
    warm = {}
    for name, path in (("store", store), ("coll", coll)):
        once, twice = count_syscalls(path, 1), count_syscalls(path, 2)
        warm[name] = {k: twice.get(k, 0) - once.get(k, 0) for k in set(once) | set(twice)}
    per = {k: (warm["coll"].get(k, 0) - warm["store"].get(k, 0)) / members for k in warm["coll"]}
    top = sorted((k for k in per if k != "total"), key=lambda k: -per[k])[:5]
    return {"validate_syscalls_store": warm["store"].get("total", 0),
            "validate_syscalls_coll": warm["coll"].get("total", 0),
            "validate_syscalls_per_member": round(per.get("total", 0.0), 2),
            "validate_syscalls_per_member_by_name": {k: round(per[k], 2) for k in top}}


#: ``--process``: each command run as a whole process (interpreter start, imports, numba cache loads included).
COMMANDS = {"open": None, "pack": ["pack", "{p}", "--capacity", str(CAPACITY), "--name", "bp", "--overwrite"],
            "validate": ["validate", "{p}"], "inspect": ["inspect", "{p}"]}
#: ``open`` has no command of its own: a process that opens the data set and reads its lengths (what every command
#: needs of it), with the imports a command makes.
OPEN_PROCESS = "import sys, packfmt.cli, packfmt; packfmt.open(sys.argv[1]).doc_lengths"


def measure_processes(path: Path, repeat: int) -> dict:
    """Best wall time of each ``COMMANDS`` entry run as ``python -m packfmt.cli ...`` (output discarded)."""
    import subprocess

    out = {}
    for name, argv in COMMANDS.items():
        cmd = ([sys.executable, "-P", "-c", OPEN_PROCESS, str(path)] if argv is None else
               [sys.executable, "-P", "-m", "packfmt.cli", *(a.format(p=path) for a in argv)])

        def run(cmd=cmd):
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=CHILD_ENV)

        out[f"process_{name}_s"] = best_of(run, repeat)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="1000x2,10000x2,1000x1000", help="MEMBERSxDOCS_PER_MEMBER, comma separated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--full", action="store_true", help="also 100000x2")
    ap.add_argument("--forms", default="auto", help="comma separated: array (JSON, format 1.3), table (member table, "
                    "2.0), auto (the writer's choice)")
    ap.add_argument("--process", action="store_true", help="also time `packfmt pack/validate/inspect` as whole "
                    "processes, store against collection")
    ap.add_argument("--syscalls", action="store_true", help="also count the system calls of one structural "
                    "validate per member (strace -f -c; beyond the store's, imports and kernel loads left out)")
    ap.add_argument("--out", default="bench_members.json", help="file name under benchmarks/results/")
    ap.add_argument("--reuse", default=None, help="build each case under DIR/MEMBERSxDOCS and keep it; a case "
                    "already built there is measured again without building (10^5 members take minutes to write)")
    args = ap.parse_args()
    cases = [tuple(int(x) for x in c.split("x")) for c in args.cases.split(",")] + ([(100_000, 2)] if args.full else [])
    rows = []
    for members, per_member in cases:
        root = (Path(args.reuse) / f"{members}x{per_member}" if args.reuse
                else Path(tempfile.mkdtemp(prefix="bench_members_")))
        try:
            t0 = time.perf_counter()
            forms = args.forms.split(",")
            if args.reuse and (root / "single").is_dir() and all((root / f"coll-{f}").is_dir() for f in forms):
                single, colls, built = root / "single", {f: root / f"coll-{f}" for f in forms}, float("nan")
            else:
                shutil.rmtree(root, ignore_errors=True)
                root.mkdir(parents=True)
                single, colls = make(root, members, per_member, forms)
                built = time.perf_counter() - t0
            if not rows:
                measure(single, 1)  # imports, numba compilation
            for form, coll in colls.items():  # the store measured again beside each form: ratios from one moment
                one, many = measure(single, args.repeat), measure(coll, args.repeat)
                row = {"members": members, "documents": members * per_member, "form": form, "build_s": round(built, 2)}
                for key in ("open_s", "pack_s", "validate_s"):
                    row[f"store_{key}"] = round(one[key], 4)
                    row[f"coll_{key}"] = round(many[key], 4)
                    row[f"{key[:-2]}_ratio"] = round(many[key] / one[key], 2)
                    row[f"{key[:-2]}_us_per_member"] = round(1e6 * (many[key] - one[key]) / members, 1)
                floor = measure_manifest_floor(coll, args.repeat)
                row["coll_manifests_read_s"] = round(floor, 4)  # the validate floor, and how far validate is above it
                row["validate_vs_manifests_read"] = round(many["validate_s"] / floor, 2)
                files = measure_member_files_floor(coll, args.repeat)  # every member's files, as validate reads them
                row["coll_member_files_s"] = round(files, 4)
                row["validate_vs_member_files"] = round(many["validate_s"] / files, 2)
                table = measure_table(coll, args.repeat)
                if table is not None:  # the member table's check alone, against the store's whole open
                    row["coll_table_check_s"] = round(table, 4)
                    row["table_check_ratio"] = round(table / one["open_s"], 2)
                if args.syscalls:
                    row.update(measure_syscalls(single, coll, members))
                if args.process:
                    one_p, many_p = measure_processes(single, args.repeat), measure_processes(coll, args.repeat)
                    for key in one_p:
                        row[f"store_{key}"] = round(one_p[key], 3)
                        row[f"coll_{key}"] = round(many_p[key], 3)
                        row[f"{key[:-2]}_ratio"] = round(many_p[key] / one_p[key], 2)
                rows.append(row)
                print(row, flush=True)
        finally:
            if not args.reuse:
                shutil.rmtree(root, ignore_errors=True)
    print_table(rows, ["members", "documents", "form", "store_open_s", "coll_open_s", "open_ratio", "store_pack_s",
                       "coll_pack_s", "pack_ratio", "store_validate_s", "coll_validate_s", "validate_ratio",
                       "open_us_per_member", "pack_us_per_member", "validate_us_per_member", "coll_table_check_s",
                       "table_check_ratio", "coll_manifests_read_s", "validate_vs_manifests_read", "coll_member_files_s",
                       "validate_vs_member_files"])
    if args.syscalls:
        print_table(rows, ["members", "documents", "form", "validate_syscalls_store", "validate_syscalls_coll",
                           "validate_syscalls_per_member"], title="system calls of one structural validate (strace)")
    if args.process:
        print_table(rows, ["members", "documents", "form", *(f"{side}_process_{c}_s" for c in COMMANDS
                                                           for side in ("store", "coll")),
                           *(f"process_{c}_ratio" for c in COMMANDS)])
    write_json(RESULTS_DIR / args.out, {"machine": machine_info(), "packfmt": packfmt.__file__, "args": vars(args),
                                        "rows": rows})


if __name__ == "__main__":
    main()
