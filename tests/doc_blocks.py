"""The code blocks of README.md and docs/*.md, as tests/test_docs_snippets.py runs them.

A page is read as a user follows it: its fenced ``bash`` and ``python`` blocks run in order, in one fresh folder,
each in its own process (bash with ``-e -o pipefail``; python as a script), with the virtualenv's ``bin`` first on
``PATH`` (``packfmt`` and ``python`` are this checkout's). A block may carry, on the lines right before its fence,
one HTML comment the reader does not see:

- ``<!-- illustrative: WHY -->``: not run (it needs a real cluster, a GPU, the network). Keep them few.
- ``<!-- slow: WHY -->``: run only by the slow suite (an S3-protocol server, Ray, torchrun).
- ``<!-- fails -->``: the block must exit with a status other than 0 (a message shown on purpose).

and a ``text`` block right after a run block, marked ``<!-- output -->``, lists lines that the run block prints
(stdout and stderr; each line of the text block, stripped, must be a substring of one printed line).

A runnable block holds no placeholder (``PLACEHOLDERS``): it is true as written.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN_LANGS = {"bash": "bash", "sh": "bash", "python": "python", "py": "python"}
#: What a block shown to be run must not hold: text a user has to replace before it runs.
PLACEHOLDERS = (r"\bTOK\b", r"path/to/", r"\.\.\.", r"<[A-Z][A-Z_]*>", r"\bYOUR_", r"\bDIR\b", r"\bHEAD:")
DIRECTIVE = re.compile(r"^<!--\s*(illustrative|slow|fails|output)\s*(?::\s*(.*?))?\s*-->\s*$")
FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)\s*$")


@dataclass
class Block:
    page: str
    line: int          # of the opening fence, 1-based
    lang: str          # as written after the fence ("" for none)
    code: str
    heading: str       # the nearest heading above it
    marks: dict = field(default_factory=dict)   # directive -> reason ("" when none given)
    expect: list[str] = field(default_factory=list)  # lines of the <!-- output --> block after it

    @property
    def kind(self) -> str | None:
        """``bash`` / ``python`` when the block runs, else None."""
        return None if "illustrative" in self.marks else RUN_LANGS.get(self.lang)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line} ({self.heading})"


def pages() -> list[Path]:
    """README.md and every guide under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, with its directives; an ``<!-- output -->`` block is attached to the run
    block before it (and not listed itself)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    page = str(path.relative_to(ROOT))
    found: list[Block] = []
    heading, marks, i = "", {}, 0
    while i < len(lines):
        text = lines[i]
        if text.startswith("#"):
            heading = text.lstrip("#").strip()
        directive = DIRECTIVE.match(text.strip())
        if directive:
            marks[directive.group(1)] = directive.group(2) or ""
            i += 1
            continue
        fence = FENCE.match(text.strip())
        if fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence.group(1)), None)
            if end is None:
                raise AssertionError(f"{page}:{i + 1}: a fence that is never closed")
            code = textwrap.dedent("\n".join(lines[i + 1:end])) + "\n"
            if "output" in marks:
                runs = [b for b in found if b.kind]
                if not runs:
                    raise AssertionError(f"{page}:{i + 1}: <!-- output --> with no run block before it")
                runs[-1].expect += [s.strip() for s in code.splitlines() if s.strip()]
            else:
                found.append(Block(page, i + 1, fence.group(2).lower(), code, heading, marks))
            marks, i = {}, end + 1
            continue
        if text.strip():
            marks = {}  # a directive applies only to the fence right after it
        i += 1
    return found


def placeholders(block: Block) -> list[str]:
    """The placeholders a run block holds (none is allowed)."""
    code = "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in block.code.splitlines())  # comments may say "..."
    return [p for p in PLACEHOLDERS if re.search(p, code)]


def environment(folder: Path) -> dict:
    """A user's shell after ``pip install``: this checkout's ``packfmt`` and ``python`` first on PATH, nothing
    downloaded, the cache inside ``folder``."""
    env = dict(os.environ)
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", MPLBACKEND="Agg",
               PACKFMT_CACHE=str(folder / ".cache" / "packfmt"), PYTHONUNBUFFERED="1")
    return env


def run(block: Block, folder: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run ``block`` in ``folder`` (its own process); the result's ``stdout`` holds stderr too."""
    if block.kind == "bash":
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    else:
        argv = [sys.executable, "-c", block.code]
    return subprocess.run(argv, cwd=folder, env=environment(folder), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def check(block: Block, result: subprocess.CompletedProcess, folder: Path) -> list[str]:
    """What is wrong with ``result`` of ``block``, run in ``folder`` (empty when nothing). A message that names a
    file by its absolute path is compared as the user sees it from ``folder``: the folder's own path left out."""
    problems = []
    if "fails" in block.marks:
        if result.returncode == 0:
            problems.append("marked <!-- fails -->, but exited 0")
    elif result.returncode != 0:
        problems.append(f"exited {result.returncode}")
    printed = [" ".join(s.split()) for s in result.stdout.replace(f"{folder}/", "").splitlines()]
    for want in block.expect:
        want = " ".join(want.split())
        if not any(want in line for line in printed):
            problems.append(f"printed no line containing {want!r}")
    return problems


# -- links

SLUG_DROP = re.compile(r"[^\w\- ]")


def slug(heading: str) -> str:
    """The anchor the forge gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return SLUG_DROP.sub("", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Anchors of every heading of a Markdown file (a repeated heading gets -1, -2 ... as on the forge)."""
    seen: dict[str, int] = {}
    out = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            in_fence = not in_fence
        if in_fence or not re.match(r"^#{1,6} ", line):
            continue
        s = slug(line.lstrip("#"))
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def broken_links(path: Path) -> list[str]:
    """Relative links (and images) of ``path`` whose file, or whose heading anchor, does not exist."""
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^(`{3,}).*?^\1\s*$", "", text, flags=re.M | re.S)  # links inside code are code
    bad = []
    for m in LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    return bad
