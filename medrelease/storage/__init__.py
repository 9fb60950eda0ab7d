"""Storage: reading extracts, the inbox of arriving files, and the release store that
publishes released rows atomically.
"""
