"""WebDataset export throughput: ``export_webdataset`` MB/s against a plain ``tarfile`` write of the same bytes.

A multimodal store (lognormal document lengths, a loss mask, one 64x64 PNG in every fourth document) is
packed with ffd at capacity 4096; the export's shard bytes per second are compared with the floor:
``tarfile`` writing the very same members (read back from the export into memory first), so the
difference is what gathering packs (segments, masks, images, ``.npy`` and JSON encoding) costs.
Both write to the same file system from a warm page cache; the export's time includes its fsyncs.

    python benchmarks/bench_export_webdataset.py            # 10^5 documents
    python benchmarks/bench_export_webdataset.py --quick    # 10^4 documents
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, machine_info, print_table, write_json  # noqa: E402

import packfmt  # noqa: E402
from packfmt.export_webdataset import export_webdataset  # noqa: E402
from packfmt.packindex import build_pack_index  # noqa: E402
from packfmt.writer import ImageRecord  # noqa: E402

IMAGE_TOKENS = 64


def make_store(root: Path, n_docs: int, vocab: int = 32000, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(5.0, 1.0, n_docs).astype(np.int64), IMAGE_TOKENS + 1, 4000)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, format="PNG")
    png = buf.getvalue()
    pool = rng.integers(0, vocab, (1 << 20) + 4096, dtype=np.int64)
    with packfmt.DatasetWriter(root, vocab_size=vocab, tokenizer={"name": "bench", "hash": None}, loss_mask=True) as w:
        for d, n in enumerate(lengths.tolist()):
            s = int(rng.integers(0, 1 << 20))
            mask = (np.arange(n) % 3 != 0).astype(np.uint8)
            images = None
            if d % 4 == 0:
                mask[:IMAGE_TOKENS] = 0
                images = [ImageRecord(png, 64, 64, "png", 0, IMAGE_TOKENS)]
            w.add_document(pool[s:s + n], mask, images)


def members_of(folder: Path) -> list[tuple[str, bytes]]:
    out = []
    for shard in sorted(folder.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            out.extend((m.name, tar.extractfile(m).read()) for m in tar)
    return out


def plain_tar(members: list[tuple[str, bytes]], path: Path) -> float:
    start = time.perf_counter()
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--docs", type=int)
    args = ap.parse_args()
    n_docs = args.docs or (10_000 if args.quick else 100_000)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        tmp = Path(tmp)
        make_store(tmp / "store", n_docs)
        idx = build_pack_index(tmp / "store", capacity=4096, algorithm="ffd").name
        rows = []
        times = []
        for rep in range(2):  # the first run warms the page cache of the store
            start = time.perf_counter()
            res = export_webdataset(tmp / "store", tmp / f"out{rep}", index=idx, shard_bytes=256 << 20)
            times.append(time.perf_counter() - start)
        mb = res.bytes / 1e6
        rows.append({"case": "export_webdataset", "packs": res.packs, "shards": len(res.shards), "MB": mb,
                     "seconds": times[-1], "MB_per_s": mb / times[-1]})
        members = members_of(tmp / "out1")
        secs = min(plain_tar(members, tmp / f"plain{k}.tar") for k in range(2))
        plain_mb = (tmp / "plain1.tar").stat().st_size / 1e6
        rows.append({"case": "tarfile (same members)", "packs": res.packs, "shards": 1, "MB": plain_mb,
                     "seconds": secs, "MB_per_s": plain_mb / secs})
        rows[0]["vs_tarfile"] = rows[0]["MB_per_s"] / rows[1]["MB_per_s"]
    print_table(rows, ["case", "packs", "shards", "MB", "seconds", "MB_per_s", "vs_tarfile"],
                title=f"WebDataset export, {n_docs:,} documents, capacity 4096")
    write_json(RESULTS_DIR / "bench_export_webdataset.json",
               {"documents": n_docs, "rows": rows, "machine": machine_info()})


if __name__ == "__main__":
    main()
