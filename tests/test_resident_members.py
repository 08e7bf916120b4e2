"""The two ways a reader holds members mapped as batches need them keep one contract (``collection.resident``):
``LocalMembers`` (a local collection past the mapping budget) and ``StreamedMembers`` (a remote collection read with
``stream=True``) declare ``ResidentMembers`` and give each of its methods with the protocol's parameters, so
``PackedDataset`` reads either through ``Dataset.resident_members()`` and nothing else."""

from __future__ import annotations

import inspect

import pytest

from packfmt.collection.lazy_members import LocalMembers
from packfmt.collection.resident import ResidentMembers
from packfmt.remote.members import StreamedMembers

METHODS = ("source", "hold", "images", "ensure")


@pytest.mark.parametrize("cls", [LocalMembers, StreamedMembers])
@pytest.mark.parametrize("name", METHODS)
def test_each_implementation_gives_the_protocols_methods(cls, name):
    assert ResidentMembers in cls.__mro__  # declared, not only alike
    own = getattr(cls, name)
    assert own is not getattr(ResidentMembers, name), f"{cls.__name__}.{name} is the protocol's empty body"
    want = list(inspect.signature(getattr(ResidentMembers, name)).parameters)
    assert list(inspect.signature(own).parameters) == want


def test_the_protocol_is_these_methods_and_pid():
    """A method added to the protocol is added here too, and so checked on both implementations."""
    assert {n for n, v in vars(ResidentMembers).items() if callable(v) and not n.startswith("_")} == set(METHODS)
    assert list(ResidentMembers.__annotations__) == ["pid"]
