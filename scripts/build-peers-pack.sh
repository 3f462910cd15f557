#!/usr/bin/env bash
# Builds build/peers/peers.tgz: llama.cpp's Python binding and server, and
# matplotlib, for the device machine (x86-64 with AVX2, maybe without
# AVX-512; CPython 3.12 with numpy; no network, no compiler), which
# scripts/device-peers.sh unpacks and puts on PYTHONPATH.
#
#     scripts/build-peers-pack.sh        (here: network for pip, gcc, python3.12)
#
# - llama-cpp-python 0.3.36 (the version in .venv) rebuilt from its sdist
#   for a portable x86-64 target: no -march=native (the default build here
#   uses this machine's AVX-512), AVX2/FMA/F16C/BMI2 on, AVX-512 off. Its
#   libraries are ctypes-loaded, so the package is the same for any Python 3.
#   They need glibc 2.34 and libstdc++ of GCC 11 (GLIBCXX_3.4.29), which any
#   system with glibc 2.34 has (the release `ferrite` needs that glibc too);
#   this compiler's libgomp goes next to them (found through their $ORIGIN
#   runpath; it needs glibc 2.34), since a machine without a compiler may
#   lack it. Its libstdc++ is not bundled: that one needs glibc 2.36.
# - The server's dependencies (fastapi, uvicorn, pydantic, ...) and
#   matplotlib with pillow as CPython 3.12 manylinux wheels; numpy is left
#   out (the device has its own).
# - Trimmed to what the benches use: tests, sample data, unused fonts,
#   fontTools' optional compiled speed-ups (pure-Python fallbacks stay),
#   pillow's AVIF/WebP/colour-management/FreeType modules and their libraries
#   (matplotlib draws text with its own FreeType), tzdata; binaries stripped.
#
# Environment: PYTHON312 (a CPython 3.12 interpreter with pip; default
# python3.12), PIP (a pip that can build the sdist; default .venv/bin/pip),
# CMAKE_BUILD_PARALLEL_LEVEL.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

LLAMA_VERSION=0.3.36
PY312="${PYTHON312:-python3.12}"
PIP="${PIP:-$ROOT/.venv/bin/pip}"
OUTDIR="$ROOT/build/peers"
WHEELS="$OUTDIR/wheels"
STAGE="$OUTDIR/pack"
mkdir -p "$WHEELS"

"$PY312" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' ||
    { echo "build-peers-pack: $PY312 is not CPython 3.12 (set PYTHON312)" >&2; exit 2; }

# 1. llama-cpp-python from its sdist, portable x86-64 (a cached wheel of the
#    native build must not be reused: --no-cache-dir).
if ! ls "$WHEELS"/llama_cpp_python-$LLAMA_VERSION-*.whl >/dev/null 2>&1; then
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF" \
        CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
        "$PIP" wheel --no-cache-dir --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$LLAMA_VERSION" -w "$WHEELS"
fi

# 2. The other wheels, for CPython 3.12 on manylinux (glibc <= 2.28).
"$PY312" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$WHEELS" "uvicorn>=0.22.0" "fastapi>=0.100.0" "pydantic-settings>=2.0.1" "sse-starlette>=1.6.1" \
    "starlette-context>=0.3.6,<0.4" "PyYAML>=5.1" "typing-extensions>=4.5.0" "diskcache>=5.6.1" \
    "jinja2>=2.11.3" matplotlib ml_dtypes

# 3. Two --target folders: site/ (llama.cpp and its server; always used) and
#    fallback/ (matplotlib, and ml_dtypes that upstream's iree.runtime
#    imports; used only where the device's Python lacks them, whose own
#    builds match its numpy: these need numpy 2).
rm -rf "$STAGE"
"$PY312" -m pip install -q --no-index --find-links "$WHEELS" --no-compile --target "$STAGE/site" \
    "llama-cpp-python[server]==$LLAMA_VERSION"
"$PY312" -m pip install -q --no-index --find-links "$WHEELS" --no-compile --target "$STAGE/fallback" \
    matplotlib ml_dtypes
cd "$STAGE/fallback"
rm -rf numpy numpy.libs numpy-*.dist-info bin share tzdata tzdata-*.dist-info
rm -rf matplotlib/tests mpl_toolkits/*/tests matplotlib/mpl-data/sample_data
rm -rf matplotlib/mpl-data/fonts/afm matplotlib/mpl-data/fonts/pdfcorefonts \
    matplotlib/mpl-data/fonts/ttf/DejaVuSerif* matplotlib/mpl-data/fonts/ttf/DejaVuSansMono*
find fontTools \( -name '*.so' -o -name '*.c' \) -delete
rm -f PIL/_avif.*.so PIL/_webp.*.so PIL/_imagingcms.*.so PIL/_imagingft.*.so
rm -f pillow.libs/libavif-* pillow.libs/libwebp* pillow.libs/libsharpyuv-* pillow.libs/liblcms2-* \
    pillow.libs/libfreetype-* pillow.libs/libharfbuzz-* pillow.libs/libbrotli* pillow.libs/libpng16-*
cd "$STAGE/site"
# lib/, include/ and bin/ at the top are llama.cpp's CMake install (the copies
# under llama_cpp/lib are the ones loaded).
rm -rf numpy numpy.libs numpy-*.dist-info bin share lib include
# llama_cpp opens lib*.so by path; the libraries' NEEDED entries name
# lib*.so.0. The wheel holds three copies of each (no symlinks in a wheel):
# keep one and link the soname to it.
(
    cd llama_cpp/lib
    for f in *.so; do
        rm -f "$f".0*
        ln -s "$f" "$f.0"
    done
    cp -L "$(gcc -print-file-name=libgomp.so.1)" .
)
cd "$STAGE"
find . -name __pycache__ -type d -prune -exec rm -rf {} +
find . -name '*.so*' -type f -exec sh -c 'file "$1" | grep -q "not stripped" && strip --strip-unneeded "$1" || true' _ {} \;
cd "$OUTDIR"
tar -czf peers.tgz -C "$STAGE" .
echo "build-peers-pack: $OUTDIR/peers.tgz $(du -h peers.tgz | cut -f1) ($(du -sh "$STAGE" | cut -f1) unpacked)"
