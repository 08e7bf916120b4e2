"""Every command total on any file: mutated manifests, member tables, layouts, mixtures and pack indexes.

Six families of files (``fuzz_cases.FAMILIES``): a store's manifest, a collection's manifest, a member table
(``members.bin``, ``member_names.txt`` and the manifest keys listing them), a pack-ordered layout (the
``layout`` record, its index's rows, ``shard_digests.bin``, ``pack_tokens.bin``), mixture records (by weights,
by proportions, a layout's source's), and pack indexes (``index.json`` and every array). Each case mutates one
file of a copy of ``fuzz_cases.build_base``'s datasets, seeded (case ``i`` is the same on every run): a value of
another JSON type, a missing or extra key, numbers at the edges (huge, negative, float, string), nested garbage,
the file cut, bits flipped, an array element at a boundary, rows swapped, another file's bytes; checksums are
fixed up after it (files tables, index bindings, member manifest checksums, shard digests), so that the
structural checks, not a checksum, must catch it.

Then every command runs on it in a subprocess (``fuzz_commands_runner.py``; a crash or a hang is a finding):
``packfmt.open`` and reading every document, ``validate`` structural and deep, ``inspect`` (summary, ``--json``,
``--show-pack``), ``pack`` (a new index, and ``--shards`` from an existing one), ``export megatron`` and
``export webdataset``, and ``PackedDataset`` reading every pack of every index. Allowed: success, with every
pack equal to a reference built from the files by bounds-checked Python (and the Megatron tokens the dataset's),
or a ``PackfmtError`` whose ``file`` and ``field`` say what is wrong. Never another exception, never a wrong
item; and a file the structural ``validate`` accepts is accepted by the reader, ``inspect`` and the exports
(what a command refuses, ``validate`` reports). A mutation that keeps the meaning (the JSON reformatted) is
accepted by everything.

The fast suite runs ``FAST_CASES`` cases per family; the slow one ``SLOW_CASES`` (``-m slow``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz_cases import FAMILIES, build_base

HERE = Path(__file__).parent
SEED = 0
FAST_CASES = 100
SLOW_CASES = 1000
#: Cases per runner process of the slow suite (so that pytest-xdist spreads a family over its workers).
CHUNK = 250
TIME_LIMIT_S = 1800
#: Commands that must accept what the structural validate accepts (``pack`` may refuse a layout, by design).
ACCEPT_WHAT_VALIDATE_ACCEPTS = ("open", "inspect", "export_megatron", "export_webdataset")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return build_base(tmp_path_factory.mktemp("fuzz-base"))


def run_cases(base: Path, family: str, first: int, count: int) -> tuple[dict[int, dict], dict]:
    """Outcomes of cases ``first .. first + count - 1``, and of the datasets unmutated; a runner that dies is started
    again after its case."""
    outcomes: dict[int, dict] = {}
    baseline: dict = {}
    start = first
    while start < first + count:
        proc = subprocess.run([sys.executable, str(HERE / "fuzz_commands_runner.py"), str(base), family, str(SEED),
                               str(start), str(first + count - start)],
                              capture_output=True, text=True, timeout=TIME_LIMIT_S, cwd=HERE)
        running = None
        for line in proc.stdout.splitlines():
            tag, _, rest = line.partition(" ")
            if tag == "BASE":
                baseline = json.loads(rest)
            elif tag == "BEGIN":
                running = int(rest)
            elif tag == "END":
                i, _, outcome = rest.partition(" ")
                outcomes[int(i)] = json.loads(outcome)
                running = None
        if running is None:
            assert proc.returncode == 0, proc.stderr[-3000:]
            break
        outcomes[running] = {"what": "?", "datasets": {"?": {"process": f"BAD runner died with {proc.returncode} "
                                                                         f"(a signal when negative): {proc.stderr[-2000:]}"}}}
        start = running + 1
    return outcomes, baseline


def _status(outcome: str) -> str:
    return outcome.split(" ", 2)[0] if outcome.startswith("refused") else outcome.split(":")[0]


def findings(outcomes: dict[int, dict], baseline: dict) -> list[str]:
    """What breaks the rules of the module docstring, one line per case and dataset."""
    out = []
    for ds, got in baseline.items():
        if any(v.startswith("BAD") or v.startswith("invalid") for v in got.values()):
            out.append(f"the unmutated {ds}: {got}")
    for i, case in sorted(outcomes.items()):
        for ds, got in case["datasets"].items():
            where = f"case {i} ({case['what']}) on {ds}"
            bad = {k: v for k, v in got.items() if v.startswith("BAD")}
            if bad:
                out.append(f"{where}: " + "; ".join(f"{k}: {v}" for k, v in bad.items()))
                continue
            if got.get("validate") == "valid":
                lax = [k for k in ACCEPT_WHAT_VALIDATE_ACCEPTS if got.get(k, "ok").startswith("refused")]
                if lax:
                    out.append(f"{where}: the structural validate accepted it, " + "; ".join(
                        f"{k} {got[k]}" for k in lax))
            if case.get("keeps") and {k: _status(v) for k, v in got.items()} != {
                    k: _status(v) for k, v in baseline.get(ds, {}).items()}:
                out.append(f"{where}: a mutation that keeps the meaning changed an outcome: {got} (unmutated: "
                           f"{baseline.get(ds)})")
    return out


def _check(outcomes: dict[int, dict], baseline: dict, count: int) -> None:
    assert len(outcomes) == count
    found = findings(outcomes, baseline)
    assert not found, f"{len(found)} finding(s) in {count} cases:\n" + "\n".join(found[:30])
    refused = sum(any(v.startswith("refused") or v.startswith("invalid") for v in got.values())
                  for case in outcomes.values() for got in case["datasets"].values())
    assert 0 < refused, "no case was refused: the mutations changed nothing"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_command_is_total_on_mutated_files(base, family):
    _check(*run_cases(base, family, 0, FAST_CASES), FAST_CASES)


@pytest.mark.parametrize("chunk", range(SLOW_CASES // CHUNK))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_command_is_total_on_a_thousand_mutations_per_family(base, family, chunk):
    _check(*run_cases(base, family, FAST_CASES + chunk * CHUNK, CHUNK), CHUNK)
