"""The cases of test_fuzz_commands.py: the datasets every case starts from, the files each family mutates, and
one case's mutation, drawn from a seed (deterministic: case ``i`` of a family is the same on every run).

``build_base(root)`` writes, in one folder (members are referred to as ``../NAME``):

* ``img``: a store with a loss mask, an image id and PNG images; pack indexes ``plain`` and ``mat``
  (materialized);
* ``web.a`` (no loss mask, no image id) and ``web.b`` (a loss mask): stores of one vocabulary;
* ``coll``: a collection of the three (``unified``, ``doc_lengths.bin``), with indexes ``plain``, ``w`` (a
  mixture by weights) and ``p`` (by proportions);
* ``tcoll``: the same members kept in a member table (format 1.4), index ``plain``;
* ``shards``: ``coll``'s index ``w`` written in pack order (a layout of 1-pack-ish shards, index 1.2 with
  ``shard_digests.bin`` and ``pack_tokens.bin``).

A family is a list of targets ``(file, kind, what, datasets)``: the file mutated, as JSON (``what``: the
subtree a value is changed in), an array (``what``: its dtype and columns) or ``name<TAB>path`` text, and
the datasets the commands then run on.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

import packfmt
from packfmt import format as F
from packfmt.collection import write_collection
from packfmt.collection.shards import write_shards
from packfmt.packindex import build_pack_index

from images import png
from mutations import fix_bindings, fix_checksums, fix_shard_digests, mutate_array, mutate_json, mutate_text

IMG = 499
I8, U8, U4, U1 = np.dtype("<i8"), np.dtype("<u8"), np.dtype("<u4"), np.dtype("u1")
TOKEN = np.dtype("<u2")  # vocabulary 500


def _store(root: Path, seed: int, *, mask: bool, images: bool = False) -> Path:
    rng = np.random.default_rng(seed)
    special = {"image": IMG} if images else None
    with packfmt.DatasetWriter(root, vocab_size=500, loss_mask=mask, special_tokens=special) as w:
        for k, n in enumerate(rng.integers(1, 40, 8)):
            toks = rng.integers(0, IMG, n)
            recs = None
            if images and k % 3 == 0 and n >= 6:
                a = int(rng.integers(1, n - 4))
                toks[a:a + 3] = IMG
                recs = [packfmt.ImageRecord(png(3 + k, 2, (40 * k % 256, 90, 10)), 3 + k, 2, "png", a, a + 3)]
            w.add_document(toks, rng.integers(0, 2, n) if mask else None, recs)
    return root


def build_base(root: Path) -> Path:
    """Every dataset of the module docstring under ``root`` (returned)."""
    _store(root / "img", 1, mask=True, images=True)
    _store(root / "web.a", 2, mask=False)
    _store(root / "web.b", 3, mask=True)
    build_pack_index(root / "img", capacity=16, name="plain")
    build_pack_index(root / "img", capacity=20, name="mat", algorithm="bfd", materialize=True)
    members = [(None, root / n) for n in ("web.a", "web.b", "img")]
    coll = write_collection(root / "coll", members)
    build_pack_index(coll.path, capacity=24, name="plain")
    build_pack_index(coll.path, capacity=24, name="w", weights={"web": 1.5, "img": 0.5})
    build_pack_index(coll.path, capacity=24, name="p", proportions={"web": 0.7, "img": 0.3}, tokens=300)
    tcoll = write_collection(root / "tcoll", members, member_table=True)
    build_pack_index(tcoll.path, capacity=24, name="plain")
    write_shards(coll.path, "w", root / "shards", shard_bytes=120)
    return root


def _index(ds: str, name: str, files: dict) -> list[tuple]:
    """The targets of one pack index: its ``index.json`` and each array file listed."""
    folder = f"{ds}/{F.PACKS_DIR}/{name}"
    return [(f"{folder}/{F.PACK_INDEX_JSON}", "json", (), (ds,))] + [
        (f"{folder}/{f}", "array", spec, (ds,)) for f, spec in files.items()]


_PLAIN = {F.PACK_OFFSETS: (I8, 1), F.SEGMENTS: (I8, 3)}
_ROWS = {"shard_digests.bin": (U8, 2), "pack_tokens.bin": (U4, 1)}

FAMILIES: dict[str, list[tuple]] = {
    "store_manifest": [("img/manifest.json", "json", (), ("img", "coll"))],
    "collection_manifest": [("coll/manifest.json", "json", (), ("coll",))],
    "member_table": [("tcoll/members.bin", "array", (I8, 4), ("tcoll",)),
                     ("tcoll/member_names.txt", "text", None, ("tcoll",)),
                     ("tcoll/manifest.json", "json", ("files",), ("tcoll",)),
                     ("tcoll/manifest.json", "json", ("members",), ("tcoll",)),
                     ("tcoll/manifest.json", "json", ("counts",), ("tcoll",))],
    "layout": [("shards/manifest.json", "json", ("layout",), ("shards",)),
               ("shards/manifest.json", "json", ("layout", "member_packs"), ("shards",))]
              + [t for t in _index("shards", "w", {**_PLAIN, **_ROWS})],
    "mixture": [("coll/packs/w/index.json", "json", ("mixture",), ("coll",)),
                ("coll/packs/p/index.json", "json", ("mixture",), ("coll",)),
                ("coll/packs/w/index.json", "json", ("mixture", "rounds"), ("coll",)),
                ("shards/manifest.json", "json", ("layout", "source", "mixture"), ("shards",))],
    "pack_index": _index("img", "plain", _PLAIN)
                  + _index("img", "mat", {**_PLAIN, F.PACK_TOKEN_OFFSETS: (I8, 1), F.PACKED_TOKENS: (TOKEN, 1),
                                          F.PACKED_LOSS_MASK: (U1, 1)})
                  + _index("coll", "plain", _PLAIN) + _index("shards", "w", {"pack_tokens.bin": (U4, 1)})[1:],
}


def _neighbours(path: Path, suffix: str) -> list[Path]:
    """Other files of the same kind beside ``path`` and one level up (what a swapped file is replaced by)."""
    near = [p for p in path.parent.glob(f"*{suffix}") if p != path]
    return near + [p for p in path.parent.parent.glob(f"*/*{suffix}") if p != path and p.parent != path.parent][:4]


def mutate_case(work: Path, family: str, i: int, seed: int) -> tuple[str, tuple[str, ...], bool]:
    """Mutate case ``i`` of ``family`` in the tree ``work`` (a copy of ``build_base``'s); return what was done, the
    datasets to run the commands on, and whether the mutation keeps the data's meaning."""
    rng = random.Random(f"{family}:{seed}:{i}")
    rel, kind, what, datasets = rng.choice(FAMILIES[family])
    path = work / rel
    keeps = False
    if kind == "json":
        desc, keeps = mutate_json(path, what, rng, _neighbours(path, ".json"))
        if rel.endswith(f"/{F.MANIFEST}") and rel.count("/") == 1:
            fix_checksums(work, rel)  # a member's manifest: its checksum in the collections that list it
            fix_bindings(path.parent)  # a collection's: its indexes bound to its member list as it now is
    elif kind == "array":
        dtype, columns = what
        desc = mutate_array(path, dtype, columns, rng, _neighbours(path, ".bin"))
        fix_checksums(work, rel, size_too=rng.random() < 0.5)
        if rel.startswith("shards/packs/") and path.name in (F.PACK_OFFSETS, F.SEGMENTS) and rng.random() < 0.5:
            fix_shard_digests(work / "shards", path.parent.name)
            desc += " (shard digests recomputed)"
    else:
        desc = mutate_text(path, rng)
        fix_checksums(work, rel, size_too=rng.random() < 0.5)
    return f"{rel}: {desc}", datasets, keeps
