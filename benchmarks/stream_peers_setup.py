"""What ``bench_stream_peers.py`` sets up: the corpus in three formats on the S3-protocol server, the nodes (each a
private ``/dev/shm``, its own link and cache folder), their reader processes, and the cache folders' peak disk use.

Only packfmt's public surface is used: ``packfmt.DatasetWriter`` and the command line (``packfmt pack STORE
--capacity N --shards s3://... --shard-size S``, which uploads the layout, manifest last).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).resolve().parent / "stream_peers_driver.py"
LIBRARIES = ("packfmt", "mds", "litdata")
#: Where each format lives in the bucket (``{shard}``: the shard size as given, e.g. 2MiB).
PREFIX = {"packfmt": "bench/packfmt-{shard}", "mds": "bench/mds-{shard}", "litdata": "bench/litdata-{shard}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def packfmt_env(**extra) -> dict:
    """The environment of a packfmt process: this checkout first on the import path, nothing downloaded."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def peers_env(**extra) -> dict:
    """The environment of a peer's process: packfmt's import path left out (its numpy and torch are its own)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def write_corpus(root: Path, n_docs: int, seed: int = 0) -> dict:
    """``root/tokens.npy`` (uint16) and ``root/offsets.npy`` of ``n_docs`` web-like documents
    (``common.web_like_corpus``: lognormal lengths, mean ~250 tokens, at most 8192)."""
    from common import web_like_corpus

    _, lengths, offsets, tokens = web_like_corpus(n_docs, seed=seed)
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / "tokens.npy", tokens)
    np.save(root / "offsets.npy", offsets)
    return {"documents": n_docs, "tokens": int(offsets[-1]), "tokens_path": str(root / "tokens.npy"),
            "offsets_path": str(root / "offsets.npy"), "lengths": lengths}


def write_packfmt(root: Path, corpus: dict, url: str, shard: str, capacity: int, endpoint: str) -> None:
    """The corpus as one store (``DatasetWriter``), packed by ``packfmt pack --shards URL`` (ffd, index ``p``)."""
    import packfmt

    store = root / "store"
    if not store.exists():
        tokens, offsets = np.load(corpus["tokens_path"]), np.load(corpus["offsets_path"])
        with packfmt.DatasetWriter(store, vocab_size=50_000, tokenizer={"name": "synthetic", "hash": None}) as w:
            w.add_documents(tokens, np.diff(offsets))
    cmd = [sys.executable, "-m", "packfmt.cli", "pack", str(store), "--capacity", str(capacity), "--name", "p",
           "--algorithm", "ffd", "--shards", url, "--shard-size", shard, "--overwrite"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                   env=packfmt_env(PACKFMT_CACHE=root / "writer-cache", AWS_ENDPOINT_URL=endpoint))


def write_peer(library: str, root: Path, corpus: dict, url: str, shard_bytes: int, python: str) -> None:
    """The corpus written by the peer's own writer (the driver under ``python``), then uploaded to ``url``."""
    out = root / f"{library}-out"
    shutil.rmtree(out, ignore_errors=True)
    spec = root / f"{library}-write.json"
    spec.write_text(json.dumps({"tokens": corpus["tokens_path"], "offsets": corpus["offsets_path"],
                                "shard_bytes": shard_bytes, "out": str(out)}))
    done = subprocess.run([python, str(DRIVER), f"write-{library}", str(spec)], env=peers_env(), cwd=root,
                          capture_output=True, text=True)  # (LitData's progress bars: shown only on a failure)
    if done.returncode:
        raise RuntimeError(f"{library} writer failed (exit {done.returncode}):\n"
                           f"{done.stdout[-2000:]}{done.stderr[-3000:]}")
    upload(out, url)


def upload(local: Path, url: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem()
    rpath = url.removeprefix("s3://")
    for f in sorted(p for p in local.rglob("*") if p.is_file()):
        fs.put_file(str(f), f"{rpath}/{f.relative_to(local).as_posix()}")
    fs.invalidate_cache()


def remote_bytes(url: str) -> tuple[int, int]:
    """(bytes, objects) under ``url``: the dataset as the store holds it (what a fetch ratio divides by)."""
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    sizes = fs.du(url.removeprefix("s3://"), total=False)
    return int(sum(sizes.values())), len(sizes)


def shm_namespaces() -> bool:
    """True when ``unshare --mount`` can give a node a private ``/dev/shm`` here (root, util-linux): two nodes on one
    machine would otherwise share Streaming's shared-memory names."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tmpfs /dev/shm"], capture_output=True)
    return probe.returncode == 0


class DiskPeak:
    """Bytes on disk under each node's cache folder, sampled every ``period`` seconds in a thread; ``peak[q]``: the
    most seen for node ``q``, ``at_peak[q]``: those bytes by file name (digits as ``#``), ``walk_peak[q]``: the most a
    walk of the folder counted. A folder that is a mount of its own (``mount_tmpfs``) is measured by ``statvfs``, at
    one instant: a walk is not (a member deleted after the walk counted it and another written before the walk
    reaches it are both counted, up to a member more than was ever on the disk at once)."""

    def __init__(self, folders: list[Path], period: float = 0.01) -> None:
        self.folders, self.period = folders, period
        self.mounted = [os.path.ismount(f) for f in folders]
        self.peak = [0] * len(folders)
        self.walk_peak = [0] * len(folders)
        self.at_peak: list[dict] = [{} for _ in folders]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="disk-peak")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for q, folder in enumerate(self.folders):
                kinds: dict = {}
                walked = allocated(folder, kinds)
                self.walk_peak[q] = max(self.walk_peak[q], walked)
                total = used_bytes(folder) if self.mounted[q] else walked
                if total > self.peak[q]:
                    self.peak[q], self.at_peak[q] = total, kinds
            self._stop.wait(self.period)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        return self.peak


_DIGITS = str.maketrans("0123456789", "#" * 10)


def used_bytes(mount: Path) -> int:
    """Bytes in use on the file system mounted at ``mount`` (one ``statvfs``: one instant)."""
    st = os.statvfs(mount)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def mount_tmpfs(folders: list[Path], nbytes: int) -> list[Path]:
    """A tmpfs of ``nbytes`` mounted at each of ``folders`` (made), when this process may mount (root); the
    folders mounted (unmount them with ``unmount``)."""
    if os.geteuid() != 0:
        return []
    done = []
    for f in folders:
        f.mkdir(parents=True, exist_ok=True)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(nbytes)}", "tmpfs", str(f)],
                          capture_output=True).returncode == 0:
            done.append(f)
    return done


def unmount(folders: list[Path]) -> None:
    for f in folders:
        subprocess.run(["umount", "-l", str(f)], capture_output=True)


def allocated(folder: Path, kinds: dict | None = None) -> int:
    """Bytes allocated on disk to the files under ``folder`` (0 if absent; files vanishing meanwhile skipped);
    ``kinds``: filled with them by file name, digits as ``#``."""
    total, stack = 0, [str(folder)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                else:
                    n = e.stat(follow_symlinks=False).st_blocks * 512
                    total += n
                    if kinds is not None and n:
                        key = e.name.translate(_DIGITS)
                        kinds[key] = kinds.get(key, 0) + n
            except OSError:
                pass
    return total


def spawn_nodes(specs: list[list[dict]], work: Path, namespaces: bool, timeout: float) -> tuple[float, list[dict]]:
    """Start every rank (``specs[q]``: node ``q``'s ranks, each a driver ``read`` spec with its ``python`` and
    ``env``, the variables set on top of ``peers_env()``), each node's ranks in one private ``/dev/shm`` when
    ``namespaces``; wait for all. Returns (the time just before the first start, each rank's result with ``node``
    and ``t_spawn`` added)."""
    procs, logs = [], []
    t0 = time.time()
    for q, node in enumerate(specs):
        cmds = []
        for spec in node:
            path = work / f"rank{spec['rank']}.json"
            path.write_text(json.dumps(spec))
            env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in spec["env"].items())
            cmds.append(f"env {env} {shlex.quote(spec['python'])} {shlex.quote(str(DRIVER))} read {path}")
        # every rank in the background, the node's exit status the first failure's
        script = " ".join(f"{c} & p{i}=$!;" for i, c in enumerate(cmds)) + " rc=0; " + " ".join(
            f"wait $p{i} || rc=$?;" for i in range(len(cmds))) + " exit $rc"
        if namespaces:
            script = f"mount -t tmpfs -o size=4g tmpfs /dev/shm && {{ {script}; }}"
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
        else:
            argv = ["sh", "-c", script]
        log = open(work / f"node{q}.log", "wb")
        logs.append(log)
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                      env=peers_env()))
    deadline = time.monotonic() + timeout
    failed = []
    for q, p in enumerate(procs):
        try:
            rc = p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            rc = "timeout"
        if rc != 0:
            failed.append((q, rc))
    for log in logs:
        log.close()
    if failed:
        tails = "\n".join(f"--- node {q} (exit {rc}):\n" + (work / f"node{q}.log").read_text(errors="replace")[-3000:]
                          for q, rc in failed)
        raise RuntimeError(f"reader processes failed:\n{tails}")
    results = []
    for q, node in enumerate(specs):
        for spec in node:
            r = json.loads(Path(spec["out"]).read_text())
            r.update(node=q, t_spawn=t0, delivered=np.load(spec["delivered"]))
            results.append(r)
    return t0, results
