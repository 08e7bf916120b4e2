"""The spec's own cross-references hold: every "§N" names a section that exists, every "§N item K"
an item that exists, every link a file and heading that exist, and the invariants V1..Vn of
FORMAT.md §6 are numbered without gaps, each one checked somewhere in packfmt/ (a ``V<n>`` tag
at the check, in whichever module the check lives).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "spec"
DOCS = sorted(p.name for p in SPEC.glob("*.md"))
#: Documents whose bare "§N" means a section of FORMAT.md (they say so in their first lines);
#: the others (FORMAT.md, READER.md, packing.md) number their own sections.
REFERS_TO_FORMAT = {"EXAMPLE.md", "GLOSSARY.md", "README.md", "SECURITY.md"}

_HEADING = re.compile(r"^#{2,6}\s+(\d+(?:\.\d+)*)\.?\s", re.M)
# "FORMAT.md §9 item 2", "READER.md §2", "§4.1": an optional document, the section, an optional item
_REF = re.compile(r"(?:\b([A-Za-z]+)(?:\.md)?\s+)?§(\d+(?:\.\d+)*)(?:\s+items?\s+(\d+))?")
_LINK = re.compile(r"\]\(([^)\s]*)\)")


def _text(name: str) -> str:
    return (SPEC / name).read_text("utf-8")


def _without_code(text: str) -> str:
    """The text outside fenced code blocks (bytes and JSON there hold no references)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def sections(name: str) -> set[str]:
    return set(_HEADING.findall(_text(name)))


def section_body(name: str, number: str) -> str:
    text = _text(name)
    m = re.search(rf"^(#{{2,6}})\s+{re.escape(number)}\.?\s.*$", text, re.M)
    assert m, f"{name}: no section {number}"
    end = re.compile(rf"^#{{2,{len(m.group(1))}}}\s", re.M).search(text, m.end())
    return text[m.end():end.start() if end else len(text)]


def _doc_named(word: str | None) -> str | None:
    """The spec document a word before "§" names ("FORMAT", "READER.md", "packing"), else None."""
    if word is None:
        return None
    for doc in DOCS:
        if doc[:-3].lower() == word.lower():
            return doc
    return None


def references(name: str):
    """``(target document, section, item or None, the matched text)`` of every § reference."""
    for m in _REF.finditer(_without_code(_text(name))):
        target = _doc_named(m.group(1)) or ("FORMAT.md" if name in REFERS_TO_FORMAT else name)
        yield target, m.group(2), m.group(3), m.group(0)


@pytest.mark.parametrize("name", DOCS)
def test_every_section_reference_exists(name):
    refs = list(references(name))
    dangling = [text for target, number, _, text in refs if number not in sections(target)]
    assert not dangling, f"{name}: references to missing sections: {dangling}"


@pytest.mark.parametrize("name", DOCS)
def test_every_item_reference_exists(name):
    for target, number, item, text in references(name):
        if item is None:
            continue
        items = re.findall(r"^(\d+)\.\s", section_body(target, number), re.M)
        assert item in items, f"{name}: {text!r}: {target} §{number} has items {items}"


@pytest.mark.parametrize("name", DOCS)
def test_links_point_to_existing_files_and_headings(name):
    for link in _LINK.findall(_text(name)):
        if link.startswith(("http://", "https://")):
            continue
        file, _, anchor = link.partition("#")
        target = SPEC / file if file else SPEC / name
        assert target.exists(), f"{name}: link to missing file {link!r}"
        if anchor and target.suffix == ".md":
            slugs = {_slug(h) for h in re.findall(r"^#{1,6}\s+(.*)$", target.read_text("utf-8"), re.M)}
            assert anchor in slugs, f"{name}: link {link!r}: no such heading in {target.name}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_section_parser_sees_every_numbered_heading():
    assert {"1", "2.1", "4.3", "6", "9"} <= sections("FORMAT.md")
    assert {"1", "2", "7"} <= sections("READER.md")
    assert {"1", "2.6", "5"} <= sections("packing.md")


# ----------------------------------------------------------------------------- invariants
def invariant_rows() -> list[tuple[int, str]]:
    """``(n, level)`` of each row of FORMAT.md §6's tables, in order."""
    body = section_body("FORMAT.md", "6")
    return [(int(n), level) for n, level in re.findall(r"^\|\s*V(\d+)\s*\|\s*(\w+)\s*\|", body, re.M)]


def test_invariants_are_numbered_without_gaps():
    rows = invariant_rows()
    numbers = [n for n, _ in rows]
    assert numbers == list(range(1, len(rows) + 1)), numbers
    assert {level for _, level in rows} <= {"structural", "deep"}
    # every "V1–Vn" range in the spec names the last invariant
    for name in DOCS:
        for last in re.findall(r"V1\s*[–-]\s*V(\d+)", _text(name)):
            assert int(last) == len(rows), f"{name}: V1–V{last}, but FORMAT.md §6 has V1–V{len(rows)}"


def test_invariants_named_elsewhere_exist():
    count = len(invariant_rows())
    for name in DOCS:
        for n in re.findall(r"\bV(\d+)\b", _text(name)):
            assert 1 <= int(n) <= count, f"{name}: V{n} is not an invariant of FORMAT.md §6"


def test_every_invariant_is_tagged_where_it_is_checked():
    tagged = set()
    for path in (ROOT / "packfmt").rglob("*.py"):
        tagged |= {int(n) for n in re.findall(r"\bV(\d+)\b", path.read_text("utf-8"))}
    missing = [f"V{n}" for n, _ in invariant_rows() if n not in tagged]
    assert not missing, f"no check in packfmt/ carries the tag of {missing} (add a `# V<n>` comment at the check)"


# ----------------------------------------------------------------------------- revisions
_REVISION = re.compile(r"Document revision (\d+\.\d+)")


def listed_revisions() -> dict[str, str]:
    """README.md's table: document -> its revision."""
    rows = re.findall(r"^\|\s*\[([\w.]+\.md)\]\(\1\)\s*\|\s*(\d+\.\d+)\s*\|", _text("README.md"), re.M)
    return dict(rows)


def test_readme_lists_every_document_with_the_revision_its_header_states():
    """spec/README.md "Versioning" rule 4: each document states its revision in its first lines, and README.md's table
    lists every document with that same revision."""
    listed = listed_revisions()
    assert set(listed) == set(DOCS) - {"README.md"}, sorted(set(DOCS) ^ set(listed))
    stated = {}
    for name in listed:
        head = "\n".join(_text(name).splitlines()[:12])
        found = _REVISION.findall(head)
        assert len(found) == 1, f"{name}: its first lines state no revision as 'Document revision X.Y' ({found})"
        stated[name] = found[0]
    assert stated == listed, {n: (stated[n], listed[n]) for n in listed if stated[n] != listed[n]}


@pytest.mark.parametrize("name", sorted(set(DOCS) - {"README.md"}))
def test_every_document_refers_to_the_one_versioning_rule(name):
    """The rule is written once (README.md "Versioning") and referenced, not restated, by every document."""
    assert "README.md#versioning" in "\n".join(_text(name).splitlines()[:12]), name


def test_the_changes_name_the_current_revisions():
    """The newest entry of README.md "Changes" that names a document names its current revision."""
    changes = _text("README.md").split("## Changes", 1)[1]
    for name, revision in listed_revisions().items():
        named = re.findall(rf"\b{re.escape(name)} (\d+\.\d+)", changes)
        if named:
            assert named[0] == revision, f"README.md Changes: {name} {named[0]} first, but it is {revision}"
