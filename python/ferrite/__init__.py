"""Ferrite: a memory-safe runtime for IREE-compiled programs.

`ferrite.runtime` offers the API of `iree.runtime`.
"""
