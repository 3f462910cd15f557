"""Ferrite: a memory-safe runtime for IREE-compiled programs.

`ferrite.runtime` offers the API of `iree.runtime`.

`ferrite.__version__` is the package version with the git commit the native
extension was built from (`0.1.0+g1a2b3c4d5e6f`; the plain version for a
build outside a git checkout), and `ferrite.__git_commit__` that commit in
full (or None). Both are read from the extension on first use, so
`import ferrite` alone loads nothing native.
"""


def __getattr__(name):
    if name in ("__version__", "__git_commit__"):
        from . import _ferrite

        return getattr(_ferrite, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
