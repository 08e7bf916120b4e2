"""The pieces of ``packfmt.validate``: the report, the store checks and the pack index checks."""
