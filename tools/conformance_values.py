"""The expected values of the conformance vectors (spec/conformance/README.md), read with packfmt's reader.

``write_expected(data, out)`` writes one JSON file per dataset of ``data`` (``out/<name>.json``) and
``out/samplers.json``. Every value is what a conforming reader must read or compute; the README names
the spec section that defines each. The files are formatted by ``dumps``: objects one key a line,
short arrays on one line, so that a forge shows them and a diff of them reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import xxhash

#: Datasets under ``data/`` and what each is, in the order the README lists them.
DATASETS = {
    "text": "store, uint16 ids, no loss mask; five pack indexes (ffd, bfd, truncate, drop, a seeded shuffle)",
    "chat": "store with a loss mask; one materialized pack index whose cuts fall before a trained and an untrained token",
    "images": "image-text store: a loss mask and three images (PNG RGB, raw rgb8, PNG RGBA); a balanced pack index",
    "wide": "store, uint32 ids (vocab 100000)",
    "array": "collection 1.3 of text, chat and images (member array, unified); plain, weighted and proportional indexes",
    "table": "collection 2.0 of the same members as a member table; a materialized index",
    "layout": "collection 1.3 in pack order (array's greedy-16 as shards); its index 1.2 with shard digests",
}


# ----------------------------------------------------------------------------- JSON layout
def dumps(obj) -> str:
    """JSON text: objects one key a line; an array on one line when it holds scalars or fits 100 characters."""
    return _dump(obj, 0) + "\n"


def _dump(v, depth: int) -> str:
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(v, dict):
        if not v:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {_dump(x, depth + 1)}" for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(v, list):
        flat = json.dumps(v, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))
        if len(flat) <= 100 or all(not isinstance(x, (list, dict)) for x in v):
            return flat
        return "[\n" + ",\n".join(inner + _dump(x, depth + 1) for x in v) + "\n" + pad + "]"
    return json.dumps(v, ensure_ascii=False, allow_nan=False)


def _ints(a) -> list:
    return np.asarray(a).tolist()


def _hex(value: int) -> str:
    return format(int(value), "016x")


# ----------------------------------------------------------------------------- datasets
def dataset_values(path: Path) -> dict:
    """What a reader reads of the dataset at ``path``: manifest facts, documents, images, and every pack index."""
    import packfmt

    ds = packfmt.open(path)
    raw = json.loads((path / "manifest.json").read_text("utf-8"))
    out = {"format": {k: raw[k] for k in ("format", "format_version", "vocab_size", "token_dtype", "loss_mask",
                                          "special_tokens", "counts")}}
    if "members" in raw:
        out["members"] = [{"name": m.name, "path": m.path, "documents": m.documents, "tokens": m.tokens,
                           "images": m.images, "manifest": m.manifest, "doc_start": int(ds.doc_start[i])}
                          for i, m in enumerate(ds.members)]
        out["unified"] = raw.get("unified", {})
        out["doc_lengths"] = _ints(ds.doc_lengths)
    else:
        out["doc_offsets"] = _ints(ds.doc_offsets)
    out["documents"] = [_document(ds, d) for d in range(ds.num_documents)]
    if ds.num_images:
        out["images"] = [_image(ds, i) for i in range(ds.num_images)]
    if "layout" in raw:
        out["layout"] = layout_values(ds, raw["layout"])
    out["indexes"] = {name: index_values(ds, name) for name in ds.pack_index_names()}
    return out


def _document(ds, d: int) -> dict:
    doc = {"tokens": _ints(ds.document(d))}
    mask = ds.document_loss_mask(d)
    if mask is not None:
        doc["loss_mask"] = _ints(mask)
    if ds.num_images:
        doc["images"] = list(ds.images.of_document(d))
    return doc


def _image(ds, i: int) -> dict:
    images = ds.images
    blob = bytes(images.data(i))
    width, height = images.size(i)
    pixels = images.decode(i)
    return {"codec": images.codec(i), "width": width, "height": height, "bytes": len(blob),
            "checksum": "xxh3_64:" + xxhash.xxh3_64_hexdigest(blob), "token_span": _ints(images.token_spans[i]),
            "channels": int(pixels.shape[2]), "pixels": _ints(pixels)}


def index_values(ds, name: str) -> dict:
    """The rows of pack index ``name``, every pack's item, one padded item and one ``collate_varlen`` batch, and
    its mixture plan when it has one."""
    from packfmt.torch import PackedDataset, collate_varlen

    idx = ds.pack_index(name)
    raw = json.loads((idx.path / "index.json").read_text("utf-8"))
    out = {"index": {k: raw[k] for k in ("format_version", "capacity", "algorithm", "seed", "oversize", "params",
                                         "materialized", "counts")},
           "binding": {k: raw[k] for k in ("dataset", "collection") if k in raw},
           "pack_offsets": _ints(idx.pack_offsets), "segments": _ints(idx.segments),
           "pack_lengths": _ints(idx.pack_lengths)}
    if raw["materialized"]:
        out["pack_token_offsets"] = _ints(idx.pack_token_offsets)
    reader = PackedDataset(ds, name)
    out["items"] = [_item(reader[p]) for p in range(len(reader))]
    out["padded_item"] = _item(PackedDataset(ds, name, pad_to_capacity=True)[0])
    packs = sorted({len(reader) - 1, len(reader) // 2, 0}, reverse=True)  # out of index order
    batch = collate_varlen(reader.__getitems__(packs))
    rows = ("input_ids", "labels", "position_ids", "doc_ids")  # (1, T): one row
    out["batch"] = {"collate": "collate_varlen", "packs": packs,
                    **{k: v if isinstance(v, int) else _ints(v[0] if k in rows else v)
                       for k, v in batch.items() if k not in ("images", "pixel_values")}}
    if "mixture" in raw:
        out["mixture"] = mixture_values(ds, raw, idx)
    return out


def _item(item: dict) -> dict:
    keys = ("pack_id", "input_ids", "labels", "position_ids", "doc_ids", "seq_lens", "document_ids",
            "num_label_tokens", "image_ids", "image_spans")
    return {k: _ints(item[k]) for k in keys if k in item}


# ----------------------------------------------------------------------------- mixtures (COLLECTION §5)
def mixture_values(coll, raw: dict, idx) -> dict:
    """The plan: per document its member, draw ``u(seed, d)``, kept tokens and copies (counted in the index: the
    segments that begin at 0), the record, and for proportions each key's pool and cut."""
    from packfmt.collection.mixture import extra_copy_draws

    mix, segs = raw["mixture"], np.asarray(idx.segments)
    n = coll.num_documents
    copies = np.bincount(segs[segs[:, 1] == 0, 0], minlength=n)
    kept = np.asarray(coll.doc_lengths, dtype=np.int64)  # oversize "split": every token kept
    assert raw["oversize"] == "split"
    u = extra_copy_draws(mix["seed"], np.arange(n))
    member = coll.member_of(np.arange(n))
    names = [m.name for m in coll.members]
    docs = [{"document": d, "member": names[member[d]], "u": float(u[d]), "kept": int(kept[d]),
             "copies": int(copies[d])} for d in range(n)]
    out = {"record": mix, "documents": docs}
    if "target" in mix:
        keys = {m["name"]: m["key"] for m in mix["members"]}
        out["keys"] = {}
        for key, plan in mix["plan"].items():
            pool = [d for d in range(n) if keys[names[member[d]]] == key]
            order = sorted(pool, key=lambda d: (u[d], d))
            pool_kept, extra = int(kept[pool].sum()), order[:plan["extra_documents"]]
            out["keys"][key] = {"pool": pool, "kept_tokens": pool_kept, **plan,
                                "remainder": plan["tokens"] - plan["copies"] * pool_kept, "order": order,
                                "extra": extra, "held": plan["copies"] * pool_kept + int(kept[extra].sum())}
    return out


# ----------------------------------------------------------------------------- the layout (COLLECTION §9)
def layout_values(coll, layout: dict) -> dict:
    """Each shard's packs, documents and rows digests (§9.4), each document's lookahead bit (§9.1)."""
    idx = coll.pack_index(layout["index"])
    po, segs = np.asarray(idx.pack_offsets), np.asarray(idx.segments)
    digests = np.fromfile(idx.path / "shard_digests.bin", dtype="<u8").reshape(-1, 2)
    c = np.concatenate([[0], np.cumsum(layout["member_packs"])])
    shards = [{"name": m.name, "packs": [int(c[k]), int(c[k + 1])],
               "documents": [int(coll.doc_start[k]), int(coll.doc_start[k + 1])],
               "pack_offsets_rows": _hex(digests[k, 0]), "segments_rows": _hex(digests[k, 1])}
              for k, m in enumerate(coll.members)]
    lookahead = (np.asarray(coll.doc_lengths) - segs[:, 2]).tolist()
    return {"record": layout, "shards": shards, "lookahead": lookahead,
            "pack_tokens": _ints(np.fromfile(idx.path / "pack_tokens.bin", dtype="<u4")),
            "pack_groups": _ints(coll.member_of(segs[po[:-1], 0]))}


# ----------------------------------------------------------------------------- samplers (READER §6)
#: ``(shuffle, seed, epoch, num_replicas, nodes, window, drop_last, balance)`` of each deal.
DEALS = [
    (True, 0, 0, 1, 1, None, False, "none"),
    (False, 0, 0, 3, 1, None, True, "none"),
    (True, 0, 1, 3, 1, None, False, "tokens"),
    (True, 5, 0, 4, 2, None, False, "none"),
    (True, 5, 0, 4, 2, 2, True, "tokens"),
    (True, 1, 2, 2, 1, 1, False, "images"),
    (True, 0, 0, 6, 3, 2, False, "tokens"),
    (True, 3, 4, 8, 2, None, False, "none"),
]
#: Resumes: a deal (as above) stopped after ``yielded`` packs a rank, resumed on ``(num_replicas, nodes)``;
#: the second resumes the state the first's new deal saves after one pack (an earlier deal in ``deals``).
RESUMES = [
    ((True, 5, 0, 4, 2, 2, False, "tokens"), 1, [(3, 1), (2, 2)]),
    ((True, 0, 1, 3, 1, None, False, "tokens"), 1, [(3, 1)]),
    ((True, 0, 1, 3, 1, None, False, "none"), 1, [(2, 1)]),
]


def _sampler(reader, cfg, rank: int = 0):
    from packfmt.torch import DistributedPackSampler

    shuffle, seed, epoch, replicas, nodes, window, drop_last, balance = cfg
    s = DistributedPackSampler(reader, replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last,
                               balance=balance, window=window, nodes=nodes)
    s.set_epoch(epoch)
    return s


def _config(cfg) -> dict:
    keys = ("shuffle", "seed", "epoch", "num_replicas", "nodes", "window", "drop_last", "balance")
    return dict(zip(keys, cfg))


def sampler_values(path: Path, index: str) -> dict:
    """Global orders and every rank's packs for each of ``DEALS``, and the resumes of ``RESUMES``."""
    from packfmt.torch import PackedDataset

    reader = PackedDataset(path, index)
    out = {"dataset": f"data/{path.name}", "index": index, "num_packs": len(reader),
           "fingerprint": reader.fingerprint, "pack_weights": {"tokens": _ints(reader.pack_num_tokens()),
                                                               "images": _ints(reader.pack_num_images())},
           "pack_groups": _ints(reader.pack_groups()), "deals": [], "resumes": []}
    for cfg in DEALS:
        one = (*cfg[:3], 1, 1, cfg[5], False, "none")  # one rank: its packs are the global order itself
        out["deals"].append({"sampler": _config(cfg), "order": list(map(int, _sampler(reader, one))),
                             "len": len(_sampler(reader, cfg)),
                             "assignment": [list(map(int, _sampler(reader, cfg, r))) for r in range(cfg[3])]})
    for cfg, yielded, shapes in RESUMES:
        state = _sampler(reader, cfg).state_dict(num_consumed=yielded)
        for replicas, nodes in shapes:
            new = (*cfg[:3], replicas, nodes, *cfg[5:])
            ranks = [_sampler(reader, new, r) for r in range(replicas)]
            for s in ranks:
                s.load_state_dict(state)
            out["resumes"].append({"saved_by": _config(cfg[:3] + (state["num_replicas"], state["nodes"]) + cfg[5:]),
                                   "state": state, "resume_on": {"num_replicas": replicas, "nodes": nodes},
                                   "len": len(ranks[0]), "assignment": [list(map(int, s)) for s in ranks]})
            state = ranks[0].state_dict(num_consumed=1)  # for the next shape, if any
    return out


def write_expected(data: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, about in DATASETS.items():
        values = {"dataset": f"data/{name}", "about": about, **dataset_values(data / name)}
        (out / f"{name}.json").write_text(dumps(values), encoding="utf-8")
    (out / "samplers.json").write_text(dumps(sampler_values(data / "layout", "greedy-16")), encoding="utf-8")
