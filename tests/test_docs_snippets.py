"""Every code block of README.md and docs/*.md runs as written (issue 29, "First contact").

Each page runs as a user follows it: its bash and python blocks in order, in one fresh folder, on data the
blocks themselves make (from the sample data that ships with packfmt). A guide runs dozens of commands, each a
process that imports numpy, numba, torch or transformers (a page takes 0.5-3 minutes on the shared 2-core
machine), so the fast suite runs the pages of ``FAST_PAGES`` (their blocks not marked slow) and the slow suite
runs every guide whole, with a real S3-protocol server (moto on 127.0.0.1, ``AWS_ENDPOINT_URL`` set, the bucket
``my-bucket`` created), and the README's walkthrough (its quick start, then its bucket example) in an empty
folder. How a page marks its blocks: tests/doc_blocks.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import doc_blocks as D
import limits
from s3_server import s3_server  # noqa: F401  (fixture)

BUCKET = "my-bucket"  # the bucket the guides name
BLOCK_S = 240         # one block on an idle machine (scaled by the load)
#: Pages the fast suite runs (their blocks not marked slow), and why these.
FAST_PAGES = {
    "README.md": "the quick start, a new user's first minute",
    "docs/troubleshooting.md": "every message it shows is the one packfmt prints today",
}


def _runs(page: Path, slow: bool) -> list[D.Block]:
    return [b for b in D.blocks(page) if b.kind and (slow or "slow" not in b.marks)]


def _ids(pages: list[Path]) -> list[str]:
    return [str(p.relative_to(D.ROOT)) for p in pages]


FAST = [D.ROOT / name for name in FAST_PAGES]
GUIDES = [p for p in D.pages()[1:] if _runs(p, slow=True)]  # the README runs whole in test_readme_walkthrough


def run_blocks(blocks: list[D.Block], folder: Path) -> list[str]:
    """Run ``blocks`` in order in ``folder``; stop at the first that goes wrong. Returns what each printed."""
    printed = []
    for block in blocks:
        result = D.run(block, folder, limits.scaled(BLOCK_S))
        problems = D.check(block, result, folder)
        if problems:
            pytest.fail(f"{block.where}, a {block.kind} block: {'; '.join(problems)}\n--- block:\n{block.code}"
                        f"--- printed (last 4,000 characters):\n{result.stdout[-4000:]}", pytrace=False)
        printed.append(result.stdout)
    return printed


@pytest.mark.parametrize("page", FAST, ids=_ids(FAST))
def test_page_runs_as_written(page, tmp_path):
    run_blocks(_runs(page, slow=False), tmp_path)


@pytest.fixture
def bucket(s3_server):
    """``s3://my-bucket`` on the S3-protocol server, empty."""
    if s3_server.exists(BUCKET):
        s3_server.rm(BUCKET, recursive=True)
    s3_server.mkdir(BUCKET)
    return f"s3://{BUCKET}"


@pytest.mark.parametrize("page", GUIDES, ids=_ids(GUIDES))
def test_page_runs_whole_with_servers(page, tmp_path, bucket):
    run_blocks(_runs(page, slow=True), tmp_path)


def test_readme_walkthrough(tmp_path, bucket):
    """The issue's proof: in an empty folder, the README's quick start, then its bucket example, as written."""
    readme = D.blocks(D.ROOT / "README.md")
    quick = [b for b in readme if b.kind and b.heading == "Quick start"]
    remote = [b for b in readme if b.kind and b.heading == "Train from a bucket"]
    assert len(quick) == 1 and remote, "README: one Python block under 'Quick start', blocks under 'Train from a bucket'"
    assert quick[0].kind == "python" and len(quick[0].code.splitlines()) <= 20, "the quick start: ~15-20 lines of Python"
    assert sum(len(b.code.splitlines()) for b in remote) <= 15, "the bucket example: <= 15 lines, upload included"
    assert quick[0].expect and remote[-1].expect, "each shows what it prints (<!-- output -->)"
    assert any(" s3://" in b.code for b in remote if b.kind == "bash"), "the bucket example uploads"
    printed = run_blocks([*quick, *remote], tmp_path)
    assert "input_ids" in printed[0]
    assert list((tmp_path / ".cache" / "packfmt").rglob("manifest.json")), "the data was read from the bucket's cache"
