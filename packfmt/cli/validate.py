"""``packfmt validate PATH [--deep] [--json] [--quiet]``: check a dataset and its pack indexes.

Exit status: 0 valid (warnings allowed), 1 invalid (or PATH is not a dataset), 2 unusable arguments.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(sub) -> None:
    p = sub.add_parser(
        "validate", help="check a dataset against the spec (structural by default, --deep reads every byte)",
        description="Check a packfmt dataset directory and every pack index under it. The default structural check "
                    "reads only the manifests and offsets arrays (fast at any size); --deep also verifies every "
                    "checksum, token range, loss mask values, image metadata, and that each pack index covers every "
                    "document as its oversize policy says. Every problem is reported, not only the first.")
    p.add_argument("path", help="dataset directory or URL (s3://..., gs://...: read through the local cache)")
    p.add_argument("--deep", action="store_true", help="also read every byte (checksums, token ids, pack coverage)")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing; the exit status tells (0 valid, 1 invalid)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--skip-image-decode", action="store_true",
                   help="with --deep, do not decode every image (V20); checksums still cover the image bytes")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..validate import validate

    show_progress = not (args.quiet or args.no_progress) and sys.stderr.isatty()
    report = validate(args.path, deep=args.deep, progress=show_progress, decode_images=not args.skip_image_decode)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    elif not args.quiet:
        stream = sys.stdout if report.ok else sys.stderr
        print(report.format(), file=stream)
    return 0 if report.ok else 1
