"""The data model: dataset configs, taxonomies, the count table and the lattice of its roll-ups.

Everything a mechanism reads is built here from the extract once: cells and counts, never rows.
"""
