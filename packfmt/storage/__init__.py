"""Object storage: every dataset path may be an fsspec URL (``s3://``, ``gs://``, ``file://`` ...).

Only this package imports fsspec, and only when a URL is given (``pip install 'packfmt[s3]'``). It knows bytes at
URLs and the cache's mechanics, never a dataset: which files a dataset at a URL has is ``packfmt.remote``'s.

* ``uri``: local path or URL; the fsspec file system of a URL; member paths resolved inside their bucket.
* ``transport``: every request to object storage, with a deadline and bounded retries (``remote``, ``Remote``;
  ``$PACKFMT_TIMEOUT``, ``$PACKFMT_RETRIES``).
* ``remote_json``: JSON read from a URL, its size bounded before its bytes are read, parsed by ``format``'s rule.
* ``inputs``: build inputs in object storage fetched to a temp dir.
* ``cache``: files at URLs mirrored into a verified, locked, bounded node-local cache (``Fetcher``, pins, LRU).
* ``verify``: what the cache knows of each mirrored file (markers bound to its stat), kept outside the mirror.
* ``errors``: back-end and cache failures (an eviction's too) as one-line ``StorageError``s naming the URL and the fix.
* ``upload``: outputs written locally and uploaded with the manifest last.
* ``ranges``: ranged reads of remote inputs (JSONL byte ranges cut at newlines, Parquet row groups) for the Ray build.
"""

from __future__ import annotations

from .uri import MissingExtraError, is_remote, is_url, local_file

__all__ = ["is_url", "is_remote", "local_file", "MissingExtraError", "remote_output", "download_inputs"]


def remote_output(url, storage_options=None, *, overwrite=False, cache_dir=None):
    from .upload import remote_output as out

    return out(url, storage_options, overwrite=overwrite, cache_dir=cache_dir)


def download_inputs(paths, storage_options=None):
    """Build inputs: URLs downloaded (files or folders) into a fresh temp dir; ``(local paths, temp dir or None)``."""
    from .inputs import download_inputs as dl

    return dl(paths, storage_options)  # (a failure removes the temp dir and is one line)
