"""The documentation holds together: README.md's first commands, links that lead somewhere, code blocks without
placeholders, the benchmark results the docs cite (and only those) on disk. Running the blocks:
tests/test_docs_snippets.py."""

from __future__ import annotations

import re

import pytest

import doc_blocks as D

SETUP = "bash tools/demo.sh", "bash tools/test.sh"
RESULTS = D.ROOT / "benchmarks" / "results"
#: Where a results file may be cited as a measurement (a benchmark script's default --out is where it writes, not
#: a citation).
CITERS = ["README.md", "docs/*.md", "spec/*.md", "tests/*.py", "packfmt/**/*.py"]


def test_readme_starts_with_the_two_setup_commands():
    """CI (.ci/run) and the house rules run the README's first two commands: they stay first, exactly."""
    first = D.blocks(D.ROOT / "README.md")[0]
    commands = [line.split("#", 1)[0].strip() for line in first.code.splitlines() if line.strip()]
    assert first.lang == "bash" and tuple(commands) == SETUP, commands


@pytest.mark.parametrize("page", D.pages(), ids=lambda p: str(p.relative_to(D.ROOT)))
def test_relative_links_lead_somewhere(page):
    assert not D.broken_links(page), D.broken_links(page)


def test_run_blocks_hold_no_placeholders():
    bad = [f"{b.where}: {D.placeholders(b)}" for p in D.pages() for b in D.blocks(p) if b.kind and D.placeholders(b)]
    assert not bad, "write blocks that run as written (or mark them <!-- illustrative: why -->):\n" + "\n".join(bad)


def test_illustrative_blocks_are_few_and_say_why():
    marked = [b for p in D.pages() for b in D.blocks(p) if "illustrative" in b.marks]
    assert all(b.marks["illustrative"] for b in marked), [b.where for b in marked if not b.marks["illustrative"]]
    runnable = [b for p in D.pages() for b in D.blocks(p) if b.lang in D.RUN_LANGS]
    assert len(marked) <= len(runnable) // 4, f"{len(marked)} of {len(runnable)} blocks illustrative: " + \
        ", ".join(b.where for b in marked)


def test_the_guides_are_linked_from_the_readme():
    readme = (D.ROOT / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in D.pages()[1:] if f"docs/{p.name}" not in readme]
    assert not missing, f"README.md's map does not link {missing}"


def _cited() -> dict[str, list[str]]:
    """``results/<name>.json`` cited -> the files citing it."""
    cited: dict[str, list[str]] = {}
    for pattern in CITERS:
        for path in D.ROOT.glob(pattern):
            for name in re.findall(r"results/([\w.-]+\.json)", path.read_text(encoding="utf-8", errors="replace")):
                cited.setdefault(name, []).append(str(path.relative_to(D.ROOT)))
    return cited


def test_every_cited_result_exists():
    missing = {name: files for name, files in _cited().items() if not (RESULTS / name).exists()}
    assert not missing, f"cited but not in benchmarks/results/: {missing}"


def test_every_result_is_cited_by_the_benchmarks_page():
    """benchmarks/results/ holds the current result of each benchmark (git holds the history), each one the page
    on measured figures (docs/benchmarks.md) cites."""
    page = (D.ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    uncited = sorted(p.name for p in RESULTS.glob("*.json") if f"results/{p.name}" not in page)
    assert not uncited, f"not cited by docs/benchmarks.md (cite it, or delete it if it is history): {uncited}"
