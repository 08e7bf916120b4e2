"""A reader of the conformance vectors written from spec/ alone: numpy and the standard library, no packfmt.

``tests/test_conformance.py`` runs it beside packfmt's reader: both must give every value of
``spec/conformance/expected/``. It follows the words of the spec, not packfmt's code, so that the
vectors are checked against the spec's rules and not only against the program that wrote them; it
is also the procedure of spec/conformance/README.md in code, and deliberately plain (lists, loops):
it checks no invariant and is not a reader for real data.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

IGNORE = -100
_TOKEN_DTYPES = {"uint16": "<u2", "uint32": "<u4"}


def _json(path: Path) -> dict:
    return json.loads(path.read_text("utf-8"))


def _array(path: Path, dtype: str) -> np.ndarray:
    return np.fromfile(path, dtype=np.dtype(dtype))


def members_of(path: Path, manifest: dict) -> list[dict]:
    """A collection's member entries (COLLECTION §2.1), from the manifest's array or the member table (§2.5)."""
    if manifest["members"] != "table":
        return manifest["members"]
    rec = _array(path / "members.bin", "<u8").reshape(-1, 4)
    lines = (path / "member_names.txt").read_text("utf-8").split("\n")[:-1]
    return [{"name": line.split("\t")[0], "path": line.split("\t")[1], "documents": int(r[0]), "tokens": int(r[1]),
             "images": int(r[2]), "manifest": "xxh3_64:" + format(int(r[3]), "016x")} for r, line in zip(rec, lines)]


class Dataset:
    """A store (FORMAT §1-§3) or a collection (COLLECTION §1-§2: its members' documents in member order), as lists:
    ``docs[d]`` tokens, ``masks[d]`` loss mask (all ones for a member without one in a collection with a mask;
    None without a mask), ``images[d]`` the ``(image id, begin, end)`` runs relative to the document."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.manifest = _json(self.path / "manifest.json")
        if self.manifest["format"] == "packfmt":
            stores = [self.path]
        else:
            stores = [self.path / m["path"] for m in members_of(self.path, self.manifest)]
        self.docs, self.masks, self.images, self.blobs = [], [], [], []
        has_mask = self.manifest["loss_mask"]
        for store in stores:
            self._read_store(store, has_mask)
        if not has_mask:
            self.masks = None

    def _read_store(self, path: Path, has_mask: bool) -> None:
        m = _json(path / "manifest.json")
        tokens = _array(path / "tokens.bin", _TOKEN_DTYPES[m["token_dtype"]])
        offsets = _array(path / "doc_offsets.bin", "<i8")
        mask = _array(path / "loss_mask.bin", "u1") if m["loss_mask"] else np.ones(len(tokens), np.uint8)
        first_image = len(self.blobs)
        if m["counts"]["images"]:
            doc_images = _array(path / "doc_image_offsets.bin", "<i8")
            spans = _array(path / "image_token_spans.bin", "<i8").reshape(-1, 2)
            blob_offsets = _array(path / "image_offsets.bin", "<i8")
            blobs = (path / "image_blobs.bin").read_bytes()
            meta = _array(path / "image_meta.bin", "<u4").reshape(-1, 3)
            self.blobs += [(blobs[a:b], *map(int, meta[i])) for i, (a, b) in
                           enumerate(zip(blob_offsets[:-1], blob_offsets[1:]))]
        for d in range(len(offsets) - 1):
            a, b = int(offsets[d]), int(offsets[d + 1])
            self.docs.append(tokens[a:b].tolist())
            self.masks.append(mask[a:b].tolist() if has_mask else None)
            runs = []
            if m["counts"]["images"]:
                runs = [(first_image + i, int(spans[i, 0]) - a, int(spans[i, 1]) - a)
                        for i in range(int(doc_images[d]), int(doc_images[d + 1]))]
            self.images.append(runs)

    def pad_id(self) -> int:
        pad = self.manifest["special_tokens"]["pad"]
        return 0 if pad is None else pad


class Index:
    """A pack index (FORMAT §4): its rows."""

    def __init__(self, ds: Dataset, name: str) -> None:
        path = ds.path / "packs" / name
        self.meta = _json(path / "index.json")
        self.pack_offsets = _array(path / "pack_offsets.bin", "<i8").tolist()
        self.segments = _array(path / "segments.bin", "<i8").reshape(-1, 3).tolist()
        self.ds = ds

    def pack(self, p: int) -> list[list[int]]:
        return self.segments[self.pack_offsets[p]:self.pack_offsets[p + 1]]

    def pack_lengths(self) -> list[int]:
        return [sum(e - b for _, b, e in self.pack(p)) for p in range(len(self.pack_offsets) - 1)]


def label(ds: Dataset, d: int, t: int) -> int:
    """FORMAT §7, READER §2: the next token of the same document if it is a training target, else -100."""
    doc = ds.docs[d]
    if t + 1 >= len(doc) or (ds.masks is not None and ds.masks[d][t + 1] != 1):
        return IGNORE
    return doc[t + 1]


def item(index: Index, p: int, pad_to_capacity: bool = False) -> dict:
    """Pack ``p`` as READER §1-§3 define its item."""
    ds, out = index.ds, {k: [] for k in ("input_ids", "labels", "position_ids", "doc_ids")}
    seq_lens, document_ids, image_ids, image_spans = [], [], [], []
    for s, (d, b, e) in enumerate(index.pack(p)):
        start = len(out["input_ids"])
        for t in range(b, e):
            out["input_ids"].append(ds.docs[d][t])
            out["labels"].append(label(ds, d, t))
            out["position_ids"].append(t - b)
            out["doc_ids"].append(s)
        seq_lens.append(e - b)
        document_ids.append(d)
        for image, ib, ie in ds.images[d]:
            if b <= ib and ie <= e:  # an image belongs to the segment holding its whole run (FORMAT §4.2)
                image_ids.append(image)
                image_spans.append([start + ib - b, start + ie - b])
    if pad_to_capacity:
        pad = index.meta["capacity"] - len(out["input_ids"])
        out["input_ids"] += [ds.pad_id()] * pad
        out["labels"] += [IGNORE] * pad
        out["position_ids"] += list(range(pad))
        out["doc_ids"] += [-1] * pad
    out.update({"pack_id": p, "seq_lens": seq_lens, "document_ids": document_ids,
                "num_label_tokens": sum(v != IGNORE for v in out["labels"])})
    if ds.blobs:
        out.update({"image_ids": image_ids, "image_spans": image_spans})
    return out


def collate_varlen(items: list[dict]) -> dict:
    """READER §4: the items end to end as one row, segments numbered over the batch, ``cu_seqlens``."""
    out = {k: [] for k in ("input_ids", "labels", "position_ids", "doc_ids", "document_ids", "pack_ids",
                           "image_ids", "image_spans")}
    cu, segment = [0], 0
    for it in items:
        shift = len(out["input_ids"])
        for k in ("input_ids", "labels", "position_ids", "document_ids", "image_ids"):
            out[k] += it.get(k, [])
        out["doc_ids"] += [segment + s for s in it["doc_ids"]]
        out["image_spans"] += [[a + shift, b + shift] for a, b in it.get("image_spans", [])]
        out["pack_ids"].append(it["pack_id"])
        for n in it["seq_lens"]:
            cu.append(cu[-1] + n)
        segment += len(it["seq_lens"])
    out.update({"cu_seqlens": cu, "max_seqlen": max(b - a for a, b in zip(cu, cu[1:])),
                "num_label_tokens": sum(it["num_label_tokens"] for it in items)})
    if "image_ids" not in items[0]:
        del out["image_ids"], out["image_spans"]
    return out


# ----------------------------------------------------------------------------- mixtures (COLLECTION §5)
_MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def draw(seed: int, d: int) -> float:
    """``u(seed, d)`` of COLLECTION §5."""
    return (splitmix64(splitmix64(seed) ^ d) >> 11) * 2.0 ** -53


def weight_copies(weight: float, seed: int, d: int) -> int:
    """COLLECTION §5: ``floor(w)`` copies, plus one when ``u(seed, d) < w - floor(w)``."""
    whole = int(weight // 1)
    return whole + (draw(seed, d) < weight - whole)


def proportion_plan(kept: list[int], pool: list[int], share: float, total: int, seed: int) -> dict:
    """COLLECTION §5.1 for one key: its target, whole copies, remainder, draw order and the cut ``j_k``."""
    target = int(share * total + 0.5)
    pool_kept = sum(kept[d] for d in pool)
    copies, rest = divmod(target, pool_kept) if target else (0, 0)
    order = sorted(pool, key=lambda d: (draw(seed, d), d))
    sums = [0]
    for d in order:
        sums.append(sums[-1] + kept[d])
    j = min(range(len(sums)), key=lambda i: (abs(sums[i] - rest), i)) if target else 0
    return {"tokens": target, "copies": copies, "extra_documents": j, "remainder": rest, "order": order,
            "held": copies * pool_kept + sums[j]}


# ----------------------------------------------------------------------------- samplers (READER §6)
def global_order(num_packs: int, groups: list[int], shuffle: bool, seed: int, epoch: int, window) -> list[int]:
    """READER §6 "Global order" and "Window order"."""
    if not shuffle:
        return list(range(num_packs))
    rng = np.random.default_rng([seed, epoch])
    if window is None:
        return rng.permutation(num_packs).tolist()
    run = np.cumsum([0] + [int(a != b) for a, b in zip(groups, groups[1:])])  # groups numbered by first pack
    g = rng.permutation(int(run[-1]) + 1)
    key = rng.permutation(num_packs)
    window_of = np.empty(len(g), dtype=np.int64)
    window_of[g] = np.arange(len(g)) // window
    return np.lexsort((key, window_of[run])).tolist()


def _parts(m: int, replicas: int, nodes: int, drop_last: bool) -> tuple[int, list[tuple[int, int]]]:
    """``t`` and each node's part of a sequence of ``m`` packs, as ``(begin, size)`` (READER §6 "Deals")."""
    t = m // replicas if drop_last else -(-m // replicas)
    per_node = replicas // nodes
    if nodes == 1:
        return t, [(0, min(m, t * replicas))]
    if drop_last:
        return t, [(q * per_node * t, per_node * t) for q in range(nodes)]
    sizes = [m // nodes + (q < m % nodes) for q in range(nodes)]
    return t, [(sum(sizes[:q]), sizes[q]) for q in range(nodes)]


def deal(seq: list[int], order: list[int], replicas: int, nodes: int, drop_last: bool,
         weights: list[int] | None) -> list[list[int]]:
    """Every rank's packs of a deal of ``seq`` (READER §6 "Deals", balanced by ``weights`` when given)."""
    t, parts = _parts(len(seq), replicas, nodes, drop_last)
    per_node = replicas // nodes
    ranks: list[list[int]] = [[] for _ in range(replicas)]
    for q, (begin, size) in enumerate(parts):
        entries = seq[begin:begin + size]
        pad = per_node * t - size
        if nodes == 1 or size == 0:  # the epoch's first packs, cyclically
            entries += [order[i % len(order)] for i in range(pad)]
        else:  # the part's own last packs again
            entries += [entries[(size - pad + i) % size] for i in range(pad)]
        totals = [0] * per_node
        for j in range(t):
            row = entries[j * per_node:(j + 1) * per_node]
            if weights is None:
                dealt = list(enumerate(row))
            else:  # heaviest first (ties in round order) to the lightest running total (ties to the lower rank)
                heavy = sorted(range(per_node), key=lambda a: -weights[row[a]])
                light = sorted(range(per_node), key=lambda r: (totals[r], r))
                dealt = [(light[i], row[heavy[i]]) for i in range(per_node)]
                for r, p in dealt:
                    totals[r] += weights[p]
            for r, p in sorted(dealt):
                ranks[q * per_node + r].append(p)
    return ranks


def consumed(m: int, replicas: int, nodes: int, yielded: int, drop_last: bool) -> list[bool]:
    """READER §6 "Consumed positions": which positions of a deal's sequence of ``m`` packs are done."""
    t, parts = _parts(m, replicas, nodes, drop_last)
    if yielded >= t:
        return [True] * m
    done = [False] * m
    for begin, size in parts:
        for i in range(begin, begin + min(size, yielded * (replicas // nodes))):
            done[i] = True
    return done


def resumed_deal(order: list[int], state: dict, replicas: int, nodes: int, weights) -> list[list[int]]:
    """READER §6 "Loading": what every rank of ``replicas`` ranks on ``nodes`` nodes yields next after ``state``."""
    seq = order[state["start"]:]
    for r, q, y in state["deals"]:
        seq = [p for p, done in zip(seq, consumed(len(seq), r, q, y, state["drop_last"])) if not done]
    if (replicas, nodes) == (state["num_replicas"], state["nodes"]):
        return [packs[state["yielded"]:] for packs in deal(seq, order, replicas, nodes, state["drop_last"], weights)]
    rest = consumed(len(seq), state["num_replicas"], state["nodes"], state["yielded"], state["drop_last"])
    seq = [p for p, done in zip(seq, rest) if not done]
    return deal(seq, order, replicas, nodes, state["drop_last"], weights)
