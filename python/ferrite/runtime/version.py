"""Version of this package, under the names `iree.runtime.version` uses."""

from .._ferrite import __version__ as VERSION

__all__ = ["PACKAGE_SUFFIX", "REVISIONS", "VERSION"]

# The package is published under one name, with no variant suffix.
PACKAGE_SUFFIX = ""

# The upstream IREE revision whose formats and behaviour this build follows
# (the pinned iree-base-runtime 3.13.0).
REVISIONS = {"IREE": "89ece87b89852100c0a4ac3d515e14842d090967"}
