"""Pack indexes: ``packs/<name>/`` of a store or a collection opened for reading (spec §4, COLLECTION §4).

``PackIndex`` maps and checks one index; ``list_pack_indexes`` and ``open_pack_index`` find them.
The dataset an index belongs to is handed in (anything with ``path``, ``doc_offsets``,
``np_token_dtype``, ``has_loss_mask``, ``index_binding()`` and ``document()``), so this module never
opens a dataset itself.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import numpy as np

from . import checks
from . import format as F
from . import index_format as IF
from .errors import FormatError
from .mapped import check_files_table, map_file

__all__ = ["PackIndex", "list_pack_indexes", "open_pack_index"]


def list_pack_indexes(root: Path) -> list[str]:
    """Names of the pack indexes under ``root/packs/`` (sorted; temporaries of unfinished writes excluded)."""
    packs = Path(root) / F.PACKS_DIR
    if not packs.is_dir():
        return []
    return sorted(p.name for p in packs.iterdir() if p.is_dir() and not p.name.startswith(".")
                  and (p / F.PACK_INDEX_JSON).exists())


def open_pack_index(source, name: str | None = None, *, names: list[str] | None = None) -> "PackIndex":
    """Open pack index ``name`` of a store or collection (default: the only one there is).

    A name that does not exist, or no name when there are several, is a FormatError that lists
    the indexes there are; a dataset without any says how to create one. (A ``packs/<name>``
    folder that is not a complete index gets PackIndex's own, more precise, error.)
    """
    path = source.path
    names = list_pack_indexes(path) if names is None else names  # given: a streamed collection's (the bucket's)
    if not names:
        api = f"build_pack_index({str(path)!r}, capacity=N)"
        cli = f"packfmt pack {path} --capacity N"
        what = f"{path}: no pack index" + ("" if name is None else f" (asked for {name!r})")
        raise FormatError(f"{what}; create one with {api}", file=F.PACKS_DIR, expected="a pack index", found="none",
                          cli=f"{what}; create one with `{cli}`")
    if name is None and len(names) > 1:
        raise FormatError(f"{path}: {len(names)} pack indexes {names}: pass one of them as the index name",
                          file=F.PACKS_DIR, expected="one pack index name", found=names,
                          cli=f"{path}: {len(names)} pack indexes {names}: pick one with --index NAME")
    if name is not None and name not in names and not (path / F.PACKS_DIR / name).is_dir():
        raise FormatError(f"{path}: no pack index {name!r}; the pack indexes are {names}",
                          file=F.PACKS_DIR, field=name, expected=f"one of {names}", found=name)
    return PackIndex(source, names[0] if name is None else name)



class PackIndex:
    """One pack index under ``packs/<name>/`` (spec §4): CSR of segments ``(doc, begin, end)``.

    ``store`` is the store or the collection (spec/COLLECTION.md §4) the index belongs to; its
    document ids are that source's.
    """

    def __init__(self, store, name: str, *, _built_pack_lengths: np.ndarray | None = None) -> None:
        """``_built_pack_lengths``: for ``build_pack_index`` only, which returns the index it has just
        written with the pack lengths it computed: the segment and pack bounds hold by construction
        there, so they are not read back (everything else, index.json and the file sizes, is)."""
        self.store = store
        self.name = IF.check_index_name(name)
        self.path = store.path / F.PACKS_DIR / name
        self._label = f"{F.PACKS_DIR}/{name}/"
        self.manifest = IF.parse_pack_index_manifest(
            F.read_json(self.path / F.PACK_INDEX_JSON, file=self._label + F.PACK_INDEX_JSON), file=self._label + F.PACK_INDEX_JSON)
        self._check_binding(store.index_binding())
        if "mixture" in self.manifest.raw and "collection" in self.manifest.binding:  # COLLECTION C5 (§5)
            from .collection.mixture_record import check_mixture_record

            check_mixture_record(self.manifest.raw["mixture"], file=self._label + F.PACK_INDEX_JSON,
                                 names=store.members.names, packs=self.manifest.num_packs)
        if self.manifest.name != name:
            raise FormatError(file=self._label + F.PACK_INDEX_JSON, field="name", expected=repr(name) + " (the directory name)",
                              found=repr(self.manifest.name))
        n_packed = self.manifest.raw["counts"]["packed_tokens"]
        self._layout = IF.pack_index_layout(self.manifest, store.np_token_dtype, store.has_loss_mask, n_packed)
        for fname in self._layout:
            if fname not in self.manifest.files:
                raise FormatError(f"{self._label}{F.PACK_INDEX_JSON}: files.{fname}: required entry missing",
                                  file=self._label + F.PACK_INDEX_JSON, field=f"files.{fname}", expected="present", found="missing")
        check_files_table(self.path, self.manifest.files, self._layout, where=self._label)
        # Every array is mapped now, so a reader never mixes the files of an index with those of
        # one that replaced it later; then every offset the reader indexes with is checked.
        materialized = self.manifest.materialized
        self.pack_offsets = self._array(F.PACK_OFFSETS)
        self.segments = self._array(F.SEGMENTS)
        self.pack_token_offsets = self._array(F.PACK_TOKEN_OFFSETS) if materialized else None
        self.packed_tokens = self._array(F.PACKED_TOKENS) if materialized else None
        self.packed_loss_mask = self._array(F.PACKED_LOSS_MASK) if materialized and store.has_loss_mask else None
        self.pack_lengths = self._check(n_packed) if _built_pack_lengths is None else _built_pack_lengths

    def _check_binding(self, want: dict, where=None) -> None:
        """V23 / COLLECTION C5: the index was built for this store (or this collection's member list); ``where``:
        the dataset ``want`` is of (default: the one the index is opened on)."""
        label = self._label + F.PACK_INDEX_JSON
        where = self.store.path if where is None else where
        have = self.manifest.binding
        if set(have) != set(want):
            kind = "a collection" if "collection" in have else "a single store"
            raise FormatError(f"{label}: this index was built for {kind} (it records {sorted(have)}), but "
                              f"{where} is not one (it needs {sorted(want)}); pack it again there",
                              file=label, field=sorted(have)[0], expected=sorted(want)[0], found=sorted(have)[0])
        for key, value in want.items():
            for sub, expected in (value.items() if isinstance(value, dict) else [(None, value)]):
                found = have[key][sub] if sub else have[key]
                if found != expected:
                    field = f"{key}.{sub}" if sub else key
                    what = "token store" if key == "dataset" else "member list"
                    raise FormatError(f"{label}: {field}: this index was built for another {what} (expected "
                                      f"{expected} from {where / F.MANIFEST}, found {found}); pack it again",
                                      file=label, field=field, expected=expected, found=found)

    def for_reading(self, source) -> "PackIndex":
        """This index, to read ``source``'s tokens with it (``PackedDataset(source, index=<a PackIndex>)``): the
        reader's kernels index ``source``'s documents with the segments, which were checked against the dataset the
        index was opened on (V27). A FormatError when ``source`` is another dataset than that (the binding, V23 /
        COLLECTION C5: the same checksums are the same documents); a ValueError when the index was opened on a
        streamed collection, which bounds segments by member only (its reads check each against the real lengths,
        a local read of ``source`` would not)."""
        if source is self.store:
            return self
        self._check_binding(source.index_binding(), Path(source.path))
        bounded = getattr(self.store, "segment_bounds", None)
        per_member = bounded is not None and bounded()[2] is not None
        if per_member and not source.streamed:
            raise ValueError(f"{self._label}{F.SEGMENTS}: this PackIndex was opened on a streamed collection, whose "
                             f"open bounds each segment by its member's tokens only, not by its document; "
                             f"{source.path} reads without checking them again: pass the index by name "
                             f"(index={self.name!r}) to open it on this dataset")
        return self

    def _check(self, n_packed: int) -> np.ndarray:
        """V25, V27, V29: return the int64 token count of every pack."""
        lab = self._label
        checks.raise_first(checks.offsets(self.pack_offsets, rule="V25", file=lab + F.PACK_OFFSETS,
                                          last=self.manifest.num_segments, last_what="counts.segments", strict=True,
                                          unit="every pack has >= 1 segment"))
        if self.pack_token_offsets is not None:
            checks.raise_first(checks.offsets(self.pack_token_offsets, rule="V25", file=lab + F.PACK_TOKEN_OFFSETS,
                                              last=n_packed, last_what="counts.packed_tokens", strict=False,
                                              unit="tokens per pack"))
        bounded = getattr(self.store, "segment_bounds", None)  # a store's offsets, a collection's lengths (V27)
        bounds, by_length, doc_start = bounded() if bounded is not None else (self.store.doc_offsets, False, None)
        found, lengths = checks.segments(self.segments, bounds, self.pack_offsets, file=lab + F.SEGMENTS,
                                         doc_lengths=by_length, doc_start=doc_start)
        checks.raise_first(found)
        checks.raise_first(checks.packs(lengths, self.capacity, n_packed, file=lab + F.SEGMENTS,
                                        pack_token_offsets=self.pack_token_offsets, pto_file=lab + F.PACK_TOKEN_OFFSETS))
        return lengths

    def _array(self, name: str) -> np.ndarray:
        dtype, shape = self._layout[name]
        return map_file(self.path / name, dtype, shape, file=self._label + name)

    @property
    def capacity(self) -> int:
        return self.manifest.capacity

    @property
    def algorithm(self) -> str:
        return self.manifest.algorithm

    @property
    def stats(self) -> dict:
        return self.manifest.stats

    @property
    def num_packs(self) -> int:
        return self.manifest.num_packs

    def __len__(self) -> int:
        return self.num_packs

    def pack_members(self) -> np.ndarray:
        """int64 ``(num_packs,)``: the member holding each pack's first segment's document (zeros for a store); the
        groups of the samplers' ``window`` shuffle. (An index read shard by shard takes them from its layout record,
        reading no segment: ``remote.shard_index``.)"""
        return np.asarray(self.store.member_of(np.asarray(self.segments)[np.asarray(self.pack_offsets)[:-1], 0]),
                          dtype=np.int64)

    def held(self, packs):
        """A context the reader plans and reads packs ``packs`` inside: nothing to hold for an index mapped whole (one
        read shard by shard holds the shards of ``packs``, their rows checked: ``remote.shard_index``)."""
        return nullcontext()

    def pack_segments(self, p: int) -> np.ndarray:
        """Segments of pack ``p``: view of shape ``(k, 3)``."""
        off = self.pack_offsets
        return self.segments[off[p]:off[p + 1]]

    def pack_tokens(self, p: int) -> np.ndarray:
        """Tokens of pack ``p`` in order (a view when materialized, else a concatenated copy)."""
        if self.manifest.materialized:
            o = self.pack_token_offsets
            return self.packed_tokens[o[p]:o[p + 1]]
        segs = self.pack_segments(p)
        return np.concatenate([self.store.document(int(d))[b:e] for d, b, e in segs])

    def __getstate__(self) -> dict:
        return {"store": self.store, "name": self.name}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["store"], state["name"])
