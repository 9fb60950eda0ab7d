"""Relational releases under patient-level DP (issue 58): a parent table of patients and the
child tables that reference it, released as synthetic tables with fresh keys.

``schema``: the tables, their columns and references, ``max_children``, validation and the
bound; ``flatten``: each chain's patient-normalised table; ``mechanism``: aim's rounds on those
tables and the generation; ``generate``: drawing from a model given other columns;
``evaluate``: integrity and cross-table accuracy; ``hospital`` and ``mimic``: the benchmark's
data. docs/RELATIONAL.md has the design and the privacy argument.
"""
