"""Seeded mutations of a dataset's files, and the checksums fixed up after them (the fuzz suites' shared helpers).

``boundary_values`` are the integers that matter for an array element (test_corruption.py sweeps them all;
test_fuzz_commands.py draws from them). ``mutate_json`` / ``mutate_array`` / ``mutate_text`` change one file
in place, drawing every choice from a ``random.Random``, and return what they did in words. ``fix_checksums``
then records the file's new bytes wherever the format records them (a files table, a collection index's
binding to its member list, a layout index's shard digests, a member's manifest checksum), so that only the
structural checks, not a checksum, stand between the mutated bytes and the commands.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from packfmt import format as F
from packfmt._io import checksum_file

INT64 = np.iinfo(np.int64)
_MISSING = object()


# ----------------------------------------------------------------------------- array elements
def boundary_values(dtype: np.dtype, old: int, length: int) -> list[int]:
    """The values an element of ``dtype`` is set to (``old`` excluded): -1, 0, 1, one off ``old``, the array's
    ``length``, 2^31, 2^62, the int64 extremes; for an unsigned dtype 0, 1, its maximum and ``old + 1``."""
    if dtype.kind == "u":
        top = int(np.iinfo(dtype).max)
        vals = [0, 1, top, (old + 1) % (top + 1)]
    else:
        vals = [-1, 0, 1, old - 1, old + 1, length, length + 1, 2**31, 2**62, INT64.min, INT64.max]
    return sorted({v for v in vals if v != old})


def mutate_array(path: Path, dtype: np.dtype, columns: int, rng: random.Random, swap_with: list[Path]) -> str:
    """One change to the array file at ``path`` (``columns`` per row): an element set to a boundary value, a bit
    flipped, rows swapped, the file cut or grown, or its bytes replaced by another file's (``swap_with``)."""
    data = bytearray(path.read_bytes())
    arr = np.frombuffer(bytes(data[:len(data) - len(data) % dtype.itemsize]), dtype=dtype).copy()
    kind = rng.choice(["value", "value", "value", "flip", "swap_rows", "cut", "grow", "swap_file"])
    if kind == "value" and arr.size:
        pos = rng.randrange(arr.size)
        value = rng.choice(boundary_values(dtype, int(arr[pos]), arr.size // max(columns, 1)))
        arr[pos] = value
        path.write_bytes(arr.tobytes())
        return f"{path.name}[{pos}] = {value}"
    if kind == "flip" and data:
        pos, bit = rng.randrange(len(data)), rng.randrange(8)
        data[pos] ^= 1 << bit
        path.write_bytes(bytes(data))
        return f"{path.name}: bit {bit} of byte {pos} flipped"
    rows = arr.size // max(columns, 1)
    if kind == "swap_rows" and rows >= 2:
        a, b = rng.sample(range(rows), 2)
        arr = arr[:rows * columns].reshape(rows, columns)
        arr[[a, b]] = arr[[b, a]]
        path.write_bytes(arr.tobytes())
        return f"{path.name}: rows {a} and {b} swapped"
    if kind == "grow":
        extra = bytes(rng.randrange(256) for _ in range(rng.choice([1, dtype.itemsize, dtype.itemsize * columns])))
        path.write_bytes(bytes(data) + extra)
        return f"{path.name}: {len(extra)} byte(s) appended"
    if kind == "swap_file" and swap_with:
        other = rng.choice(swap_with)
        path.write_bytes(other.read_bytes())
        return f"{path.name}: replaced by the bytes of {other.name}"
    cut = rng.randrange(len(data)) if data else 0
    path.write_bytes(bytes(data[:cut]))
    return f"{path.name}: cut to {cut} byte(s)"


# ----------------------------------------------------------------------------- JSON documents
#: Values of every JSON type, and numbers at the edges (an int64, a uint64, 2^53, a float, a string).
ODD_VALUES: list[Any] = [None, True, False, 0, 1, -1, 2, 1.5, -0.0, 1e308, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63,
                         2**64, -2**63, -2**63 - 1, 10**30, "", "1", "x", "table", "web", "web.a", "pack-ordered",
                         "xxh3_64:0000000000000000", "../x", "a" * 300, [], [1], [None], {}, {"a": 1}, {"": []}]
#: Keys added to an object: ones the format gives meaning to elsewhere, and garbage.
ODD_KEYS = ["extra", "weights", "target", "rounds", "members", "layout", "unified", "files", "mixture", "plan",
            "shares", "key", "weight", "tokens", "collection", "dataset", "", "\u00e9"]


def _paths(node: Any, here: tuple = ()) -> list[tuple]:
    """Every path (a tuple of keys and indexes) into ``node``, ``()`` included."""
    out = [here]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, here + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, here + (i,))
    return out


def _get(node: Any, path: tuple) -> Any:
    for key in path:
        node = node[key]
    return node


def _nested(rng: random.Random, depth: int) -> Any:
    """Garbage nested ``depth`` deep (lists and objects of odd values)."""
    node: Any = rng.choice(ODD_VALUES)
    for _ in range(depth):
        node = [node] if rng.random() < 0.5 else {rng.choice(ODD_KEYS): node}
    return node


def _number_near(value: Any, rng: random.Random) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return rng.choice([value + 1, value - 1, -value, value * 2**32, float(value) + 0.5, str(value), value == 0])
    return rng.choice([-1, 0, 2**63, 1.5, "3"])


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shift(values: list, where: str, rng: random.Random, first: int | None = None) -> str:
    """Move an amount from one integer of ``values`` to another (``first``, when given): the sum is kept, so only a
    check of the parts (each shard's packs, each round's) can catch it."""
    ints = [i for i, v in enumerate(values) if _is_int(v)]
    if len(ints) < 2:
        return f"{where}: unchanged (no two counts)"
    a = first if first is not None else rng.choice(ints)
    b = rng.choice([i for i in ints if i != a])
    step = rng.choice([1, values[a], -values[b]])
    values[a] -= step
    values[b] += step
    return f"{where}: {step} moved from [{a}] to [{b}] (the sum kept)"


def _edit(doc: Any, path: tuple, rng: random.Random) -> str:
    """Change the node at ``path`` of ``doc`` (in place; ``path`` not empty); what was done, in words."""
    parent, key = _get(doc, path[:-1]), path[-1]
    value = parent[key]
    where = "/".join(map(str, path))
    if isinstance(parent, list) and _is_int(value) and rng.random() < 0.3:  # an element of a list of counts:
        return _shift(parent, "/".join(map(str, path[:-1])), rng, first=key)  # a sum kept, parts changed
    kind = rng.choice(["type", "number", "number", "delete", "add", "nested", "list"])
    if kind == "delete":
        del parent[key]
        return f"{where}: removed"
    if kind == "add" and isinstance(value, dict):
        k = rng.choice(ODD_KEYS + list(value))
        value[k] = rng.choice(ODD_VALUES)
        return f"{where}: key {k!r} set to {value[k]!r}"
    if kind == "list" and isinstance(value, list) and value:
        how = rng.choice(["drop", "dup", "reverse", "empty", "append", "shift", "shift"])
        if how == "shift" and sum(map(_is_int, value)) >= 2:
            return _shift(value, where, rng)
        if how == "drop":
            value.pop(rng.randrange(len(value)))
        elif how == "dup":
            value.insert(rng.randrange(len(value)), value[rng.randrange(len(value))])
        elif how == "reverse":
            value.reverse()
        elif how == "empty":
            value.clear()
        else:
            value.append(rng.choice(ODD_VALUES))
        return f"{where}: list {how}"
    if kind == "nested":
        parent[key] = _nested(rng, rng.choice([1, 3, 30]))
        return f"{where}: nested garbage"
    if kind == "number":
        parent[key] = _number_near(value, rng)
        return f"{where}: {value!r} -> {parent[key]!r}"[:300]
    parent[key] = rng.choice([v for v in ODD_VALUES if type(v) is not type(value)])
    return f"{where}: {type(value).__name__} -> {parent[key]!r}"[:300]


def mutate_json(path: Path, subtree: tuple, rng: random.Random, swap_with: list[Path]) -> tuple[str, bool]:
    """One change to the JSON file at ``path``, inside the node at ``subtree`` (a path of keys; ``()`` the whole
    document): a value of another type, a number at an edge, a key removed or added, nested garbage, a list
    shortened or grown; or, as text, the file cut, a byte flipped, a key given twice, NaN, a nesting too deep to
    parse, or another file's bytes. Returns what was done and whether the meaning is kept (keys reordered and
    the layout changed only: every command must then give what it gave before)."""
    raw = path.read_bytes()
    doc = json.loads(raw)
    kind = rng.choice(["edit"] * 14 + ["cut", "flip", "duplicate_key", "nan", "deep", "swap_file", "reformat"])
    if kind == "reformat":
        path.write_text(json.dumps(doc, indent=rng.choice([None, 1, 4]), sort_keys=rng.random() < 0.5))
        return "reformatted (same JSON)", True
    if kind == "cut":
        cut = rng.randrange(len(raw))
        path.write_bytes(raw[:cut])
        return f"cut to {cut} byte(s)", False
    if kind == "flip":
        data = bytearray(raw)
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        return f"bit flipped in byte {pos}", False
    if kind == "duplicate_key":
        path.write_bytes(b'{"format": "packfmt", ' + raw.lstrip()[1:])
        return "key 'format' given twice", False
    if kind == "nan":
        path.write_bytes(raw.replace(b"0", b"NaN", 1))
        return "a 0 replaced by NaN", False
    if kind == "deep":
        depth = rng.choice([2000, 100_000])
        path.write_bytes(b'{"x": ' + b"[" * depth + b"]" * depth + b", " + raw.lstrip()[1:])
        return f"lists nested {depth} deep", False
    if kind == "swap_file" and swap_with:
        other = rng.choice(swap_with)
        path.write_bytes(other.read_bytes())
        return f"replaced by the bytes of {other.name}", False
    try:
        node = _get(doc, subtree)
    except (KeyError, IndexError, TypeError):
        node = _MISSING
    # inside the subtree, or (a subtree named) the subtree itself: a record null, removed, of another type
    choices = [subtree + p for p in _paths(node)[0 if subtree else 1:]] if node is not _MISSING else []
    if not choices:  # nothing inside (an empty record): replace it
        what = "replaced whole"
        if subtree:
            _get(doc, subtree[:-1])[subtree[-1]] = rng.choice(ODD_VALUES)
        else:
            doc = rng.choice([[], "x", 1])
    else:
        what = _edit(doc, rng.choice(choices), rng)
    path.write_text(json.dumps(doc, indent=2, allow_nan=True))
    return what, False


# ----------------------------------------------------------------------------- text (member_names.txt)
BAD_NAMES = ["", " ", ".", "..", "-x", "_x", "a b", "a\tb", "a" * 129, "web.a", "é", "a/b", "\x00"]
BAD_PATHS = ["", ".", "..", "/abs", "a//b", "a\\b", "../web.a", "../web.b", "../img", "../nowhere", "./x", "../coll",
             "../tcoll", "x\x00y", "..\r"]


def mutate_text(path: Path, rng: random.Random) -> str:
    """One change to a ``name<TAB>path`` line file: a name or path replaced by a bad one (or another member's),
    a line removed, repeated or swapped, the final LF removed, CRLF line ends, a TAB added, bytes not UTF-8."""
    raw = path.read_bytes()
    lines = raw.split(b"\n")[:-1] if raw.endswith(b"\n") else raw.split(b"\n")
    kind = rng.choice(["name", "path", "path", "drop", "dup", "swap", "no_final_lf", "crlf", "tab", "utf8", "cut"])
    i = rng.randrange(len(lines)) if lines else 0
    if kind in ("name", "path") and lines:
        name, _, member = lines[i].decode("utf-8", "replace").partition("\t")
        if kind == "name":
            name = rng.choice(BAD_NAMES)
        else:
            member = rng.choice(BAD_PATHS)
        lines[i] = f"{name}\t{member}".encode("utf-8")
        what = f"line {i + 1}: {kind} -> {lines[i]!r}"
    elif kind == "drop" and lines:
        lines.pop(i)
        what = f"line {i + 1} removed"
    elif kind == "dup" and lines:
        lines.insert(i, lines[i])
        what = f"line {i + 1} repeated"
    elif kind == "swap" and len(lines) >= 2:
        j = (i + 1) % len(lines)
        lines[i], lines[j] = lines[j], lines[i]
        what = f"lines {i + 1} and {j + 1} swapped"
    elif kind == "tab" and lines:
        lines[i] += b"\tmore"
        what = f"line {i + 1}: a third column"
    elif kind == "utf8" and lines:
        lines[i] = b"\xff" + lines[i]
        what = f"line {i + 1}: a byte that is not UTF-8"
    else:
        body = b"\n".join(lines) + b"\n"
        if kind == "no_final_lf":
            path.write_bytes(body[:-1])
            return "final LF removed"
        if kind == "crlf":
            path.write_bytes(body.replace(b"\n", b"\r\n"))
            return "CRLF line ends"
        cut = rng.randrange(len(body))
        path.write_bytes(body[:cut])
        return f"cut to {cut} byte(s)"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return what


# ----------------------------------------------------------------------------- checksums fixed up
def _rewrite_json(path: Path, edit) -> bool:
    """``edit(doc)`` on the JSON at ``path``, written back canonically; False (nothing written) when the file is
    not a JSON object this edit can apply to (a mutation broke it)."""
    try:
        doc = json.loads(path.read_bytes())
        edit(doc)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError):
        return False
    # F.canonical_json's bytes, but that a mutation may have put NaN in it
    path.write_bytes(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=True).encode() + b"\n")
    return True


def _set_entry(doc: dict, name: str, path: Path, size_too: bool) -> None:
    entry = doc["files"][name]
    entry["checksum"] = checksum_file(path)
    if size_too:
        entry["bytes"] = path.stat().st_size


def binding_of(collection: Path) -> str | None:
    """The ``collection`` an index of the collection at ``collection`` binds to (spec/COLLECTION.md §4), as its
    manifest (perhaps mutated) and member table give it; None when they give none."""
    try:
        doc = json.loads((collection / F.MANIFEST).read_bytes())
        members = doc["members"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if members == "table":
        try:
            data = (collection / "members.bin").read_bytes() + (collection / "member_names.txt").read_bytes()
        except OSError:
            return None
        return "xxh3_64:" + xxhash.xxh3_64(data).hexdigest()
    try:
        return "xxh3_64:" + xxhash.xxh3_64(F.canonical_json(members)).hexdigest()
    except (TypeError, ValueError):
        return None


def fix_bindings(collection: Path) -> None:
    """Every index of the collection bound to its member list as it now is."""
    binding = binding_of(collection)
    if binding is None:
        return
    for index_json in sorted((collection / F.PACKS_DIR).glob(f"*/{F.PACK_INDEX_JSON}")):
        _rewrite_json(index_json, lambda d: d.__setitem__("collection", binding) if "collection" in d else None)


def fix_shard_digests(collection: Path, index: str) -> None:
    """The layout index's ``shard_digests.bin`` recomputed from its rows (when the layout record still gives the
    shards' bounds), and its checksum fixed up: so that V25/V27 and C6, not the digests, must catch a bad row."""
    from packfmt.collection import shard_rows as R

    folder = collection / F.PACKS_DIR / index
    try:
        doc = json.loads((collection / F.MANIFEST).read_bytes())
        packs = [int(x) for x in doc["layout"]["member_packs"]]
        docs = [int(m["documents"]) for m in doc["members"]]
        po = np.fromfile(folder / F.PACK_OFFSETS, dtype=F.OFFSET_DTYPE)
        segs = np.fromfile(folder / F.SEGMENTS, dtype=F.OFFSET_DTYPE)
        segs = segs[:segs.size - segs.size % 3].reshape(-1, 3)
        c, d = R.bounds(packs, docs)
        if c[-1] >= po.shape[0] or d[-1] > segs.shape[0] or len(packs) != len(docs) or (c < 0).any():
            return
        digests = np.array([[_digest(po[int(c[k]):int(c[k + 1]) + 1]), _digest(segs[int(d[k]):int(d[k + 1])])]
                            for k in range(len(packs))], dtype=R.DIGEST_DTYPE)
    except (ValueError, KeyError, TypeError, OverflowError, IndexError, RecursionError):
        return
    digests.tofile(folder / R.SHARD_DIGESTS)
    _rewrite_json(folder / F.PACK_INDEX_JSON, lambda d: _set_entry(d, R.SHARD_DIGESTS, folder / R.SHARD_DIGESTS, False))


def _digest(rows: np.ndarray) -> int:
    """xxh3_64 of rows' bytes as an unsigned integer (spec/COLLECTION.md §9.4)."""
    return xxhash.xxh3_64(np.ascontiguousarray(rows).tobytes()).intdigest()


def fix_checksums(root: Path, rel: str, *, size_too: bool = False) -> None:
    """Record the new bytes of ``root/rel`` wherever the format records them: the files table that lists it (a
    store's manifest, an index's ``index.json``, a collection's ``files``), with its ``bytes`` too when
    ``size_too``; a store's index's ``dataset`` checksums; a collection index's binding to a member table; a
    member's manifest checksum in the collections listing it (array entries only)."""
    path = root / rel
    parts = rel.split("/")
    if parts[-1] == F.MANIFEST:
        _fix_member_checksum(root, rel)
        return
    if len(parts) >= 3 and parts[-3] == F.PACKS_DIR:  # packs/<name>/<file>
        _rewrite_json(path.parent / F.PACK_INDEX_JSON, lambda d: _set_entry(d, parts[-1], path, size_too))
        return
    owner = path.parent
    _rewrite_json(owner / F.MANIFEST, lambda d: _set_entry(d, parts[-1], path, size_too))
    if parts[-1] in (F.TOKENS, F.DOC_OFFSETS):
        for index_json in (owner / F.PACKS_DIR).glob(f"*/{F.PACK_INDEX_JSON}"):
            _rewrite_json(index_json, lambda d: d["dataset"].__setitem__(parts[-1], checksum_file(path)))
    if parts[-1] in ("members.bin", "member_names.txt"):
        fix_bindings(owner)


def _fix_member_checksum(root: Path, rel: str) -> None:
    """The checksum of the member manifest ``rel`` in every collection under ``root`` whose array lists it."""
    store = (root / rel).parent.resolve()
    new = checksum_file(root / rel)
    for manifest in sorted(root.glob(f"*/{F.MANIFEST}")):
        def edit(doc: dict, folder=manifest.parent) -> None:
            for entry in doc["members"] if isinstance(doc.get("members"), list) else []:
                if isinstance(entry, dict) and isinstance(entry.get("path"), str) \
                        and (folder / entry["path"]).resolve() == store:
                    entry["manifest"] = new
        if manifest.parent.resolve() != store and _rewrite_json(manifest, edit):
            fix_bindings(manifest.parent)
