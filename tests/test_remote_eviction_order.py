"""Which members a prefetch may delete to make room (packfmt/remote/eviction.py): only those its plan uses after the
position it fetches for. A member this process let go of (``trim``) stays on the node's disk until its next use;
deleting it for a member needed later fetched it twice (bench_stream_peers at 2 MiB: 1.3x the dataset over 2 nodes,
where each node's share was 1.0x)."""

from __future__ import annotations

import numpy as np

from packfmt.remote.eviction import Holdings

NEXT_USE = {1: 5, 2: 50, 3: 20, 4: np.iinfo(np.int64).max}  # member -> the plan position that next reads it


class _Plan:
    def next_use(self, members: np.ndarray) -> np.ndarray:
        return np.array([NEXT_USE[int(m)] for m in members], dtype=np.int64)


class _Tx:
    def __init__(self, wanted=()) -> None:
        self.leased = set(wanted)  # members another process of the node reads soon (their want lease)

    def present(self) -> np.ndarray:  # on the node's disk, least recently used first
        return np.array([1, 2, 3, 4], dtype=np.int64)

    def wanted(self, items) -> np.ndarray:
        return np.array([int(m) in self.leased for m in items], dtype=bool)

    def unwant(self, items) -> None:  # this process's leases given back: those here are another process's
        pass


def _holdings(plan) -> Holdings:
    h = Holdings.__new__(Holdings)
    h.plan, h.resident = plan, {}
    return h


def test_a_prefetch_deletes_only_members_used_after_its_position():
    h = _holdings(_Plan())
    assert h._unheld_order(_Tx(), None) == [4, 2, 3, 1]  # a batch's own fetch: furthest next use first (Belady)
    assert h._unheld_order(_Tx(), 10) == [4, 2, 3]  # a prefetch for position 10 leaves member 1 (used at 5)
    assert h._unheld_order(_Tx(), 30) == [4, 2]
    assert h._unheld_order(_Tx(), 60) == [4]  # only what the plan never reads again


def test_without_a_plan_a_prefetch_deletes_nothing():
    h = _holdings(None)
    assert h._unheld_order(_Tx(), None) == [1, 2, 3, 4]  # least recently used first
    assert h._unheld_order(_Tx(), 10) == []


def test_what_another_process_reads_soon_is_deleted_last_and_never_for_a_prefetch():
    """Member 4 is never read again here, but a sibling DataLoader worker leased it (it reads it next): a batch's
    own fetch deletes it only after every member no process wants; a prefetch never does."""
    h = _holdings(_Plan())
    assert h._unheld_order(_Tx(wanted={4}), None) == [2, 3, 1, 4]
    assert h._unheld_order(_Tx(wanted={4}), 10) == [2, 3]
    assert _holdings(None)._unheld_order(_Tx(wanted={1}), None) == [2, 3, 4, 1]


def test_a_lease_this_process_no_longer_needs_is_given_back_when_it_makes_room(tmp_path):
    """Member 4 is never read again here and this process leased it (its plan read it): making room gives the
    lease back and deletes it, without waiting for the next renewal (a lease that outlived its reads kept a fast
    reader's whole cache wanted: no prefetch found room). A sibling's lease on it is kept."""
    import time
    from types import SimpleNamespace

    from packfmt.storage.budget import Budget

    for sibling, expected in ((False, [4, 2, 3]), (True, [2, 3])):
        budget = Budget(tmp_path / f"ledger{sibling}", 5, 10**9)
        until = time.monotonic_ns() + 60 * 10**9
        with budget.transaction() as tx:
            for m in (1, 2, 3, 4):
                tx.reserve(m, 10)
                tx.commit(m, 10)
            tx.want([4], until)
        if sibling:
            with Budget(tmp_path / f"ledger{sibling}", 5, 10**9).transaction() as tx:  # another process reads it next
                tx.want([4], until - 10**9)
        h = _holdings(_Plan())
        h.node = SimpleNamespace(budget=budget)
        with budget.transaction() as tx:
            assert h._unheld_order(tx, 10) == expected
            assert tx.wanted([4]).tolist() == [sibling]


def test_a_prefetch_without_room_keeps_the_checked_manifest_for_its_next_try(monkeypatch):
    """A prefetch that found no room keeps the member's checked manifest (``KEPT_MANIFESTS`` at most, the oldest
    dropped), and the next try takes it instead of requesting it again (it was a request loop)."""
    import threading
    from collections import OrderedDict

    from packfmt.remote import members as M
    from packfmt.remote.member_fetch import member_manifest

    monkeypatch.setattr(M, "KEPT_MANIFESTS", 3)
    s = M.StreamedMembers.__new__(M.StreamedMembers)
    s.cond, s.manifests = threading.Condition(), OrderedDict()
    for m in range(5):
        s._keep_manifest(m, (b"raw%d" % m, {"f": m}, {}))
    assert list(s.manifests) == [2, 3, 4]
    s.coll, s.digests, s.url = None, [0] * 5, "s3://b/c"
    s.member_url = lambda m: f"s3://b/c/m{m}"
    assert member_manifest(s, 3, None) == (b"raw3", {"f": 3}, {})  # no request: the kept one, taken
    assert 3 not in s.manifests
