"""Version of this package, under the names `iree.runtime.version` uses."""

from .._ferrite import __git_commit__ as GIT_COMMIT
from .._ferrite import __version__ as VERSION

__all__ = ["GIT_COMMIT", "PACKAGE_SUFFIX", "REVISIONS", "VERSION"]

# VERSION is the package version with the git commit the extension was built
# from as a local label ("0.1.0+g1a2b3c4d5e6f"); GIT_COMMIT is that commit in
# full, or None for a build made outside a git checkout (VERSION is then the
# plain package version).

# The package is published under one name, with no variant suffix.
PACKAGE_SUFFIX = ""

# The upstream IREE revision whose formats and behaviour this build follows
# (the pinned iree-base-runtime 3.13.0).
REVISIONS = {"IREE": "89ece87b89852100c0a4ac3d515e14842d090967"}
