#!/usr/bin/env bash
# The llama.cpp peer benchmark (issue 20 item 4; docs/PERFORMANCE.md, "sluice and llama.cpp"):
# builds the llama.cpp that the PyPI source distribution llama-cpp-python==0.3.36 vendors (it
# has Kimi K3), converts a `sluice synth` slice with llama.cpp's own convert_hf_to_gguf.py,
# and runs tools/peer/peer_bench.py on both: --runs interleaved rounds of decode and prefill in
# memory and decode in a memory cgroup, comparing greedy ids in every decode run; then the prefill
# roofline (tools/peer/roofline.py) from `sluice probe --kernels` and tools/peer/dot_peak.c.
# Everything fetched or built lives under WORK; nothing is written to the repo.
#
#   tools/peer/peer_bench.sh SLUICE_BINARY WORK [peer_bench.py flags...]
#   tools/peer/peer_bench.sh target/release/sluice /tmp/peer-work --runs 3
#
# The cgroup rule: the issue's "memory cgroup at 1/3 of the experts" means, for the full Kimi K3,
# a limit that holds the whole spine (113 GB of bf16 non-expert weights) and 1/3 - 113/1446 = 25.5%
# of the 1,446 GB of experts. A 2-layer slice's spine is larger than 1/3 of its experts, so the
# literal 1/3 would make both engines stream their spine, which the full model never does; the
# limit is the slice's non-expert bytes + 25.5% of its expert bytes (peer_bench.py prints the
# rule and the numbers; --cgroup-bytes N overrides it).
#
# Env: LAYERS (2), EXPERTS (48), RANKS (4096): the slice (K3's real per-layer dimensions);
# PRESET (k3-slice): `sluice synth --preset`; gpt-oss-slice (LAYERS=24 EXPERTS=32: gpt-oss-20b)
# and qwen3-30b-slice (LAYERS=48: Qwen3-30B-A3B; EXPERTS is ignored) are the models people run
# in memory; with them RANKS is the vocabulary rows, the default parts are decode and prefill
# (the cgroup rule is K3's) and there is no roofline step;
# --parts decode,prefill,context adds decode after the --pp prompt (attention over pp cached
# positions); THREADS (2); PROBE_SECONDS (20: `sluice probe --kernels --seconds`); ROOFLINE=0 skips step 6;
# OUTTYPE (bf16: the converter's type for the non-expert tensors, as published;
# the MXFP4 experts are repacked as MXFP4 by the converter whatever this is); KEEP=1 keeps the
# slice and the GGUF (default: both deleted at the end); JOBS (nproc): build parallelism.
# ISA=avx2: both engines on the AVX2 tier of an AVX-512 machine, as on an AVX2-only CPU: llama.cpp
# built with GGML_NATIVE=OFF (AVX, AVX2, FMA, F16C, BMI2; no AVX-512), into build-avx2/ and
# peer_run-avx2 beside the native build, and sluice run with SLUICE_ISA=avx2.
# SDIST: a copy of the source distribution (.tar.gz as PyPI serves it, or a .tar.xz / .tar.gz of
# the same llama_cpp_python-0.3.36/ tree trimmed to what the CPU build and the converter read),
# used instead of PyPI; with it, cmake and ninja on PATH are used as they are. PEER_PYTHON: a
# Python that already has the converter's packages (torch, numpy, sentencepiece, transformers,
# pyyaml, tqdm), used instead of a venv from PyPI. Together they run on a machine with no registry.
# Needs: python3 (3.10+) with venv, a C and C++ compiler, PyPI (unless SDIST and PEER_PYTHON). The llama.cpp build uses its own
# default flags (GGML_NATIVE=ON: -march=native); peer_run prints the ISA it was built with.
# Fails (non-zero, with the reason) when the peer cannot be fetched, built or converted: it never
# reports a sluice number without its llama.cpp counterpart.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 SLUICE_BINARY WORK [peer_bench.py flags...]" >&2; exit 2; }
SLUICE=$(realpath "$1") W=$2
shift 2
LAYERS=${LAYERS:-2} EXPERTS=${EXPERTS:-48} RANKS=${RANKS:-4096} THREADS=${THREADS:-2}
PRESET=${PRESET:-k3-slice}
OUTTYPE=${OUTTYPE:-bf16} JOBS=${JOBS:-$(nproc)} VERSION=0.3.36
HERE=$(cd "$(dirname "$0")" && pwd)
fail() { echo "peer_bench.sh: $*" >&2; exit 1; }
[ -x "$SLUICE" ] || fail "$SLUICE is not an executable sluice binary"
mkdir -p "$W" && W=$(realpath "$W")
LL=$W/src/llama_cpp_python-$VERSION/vendor/llama.cpp
ISA=${ISA:-native} BUILD=$W/build PEER_RUN=$W/peer_run ISA_FLAGS=()
case $ISA in
  native) ;;
  avx2) BUILD=$W/build-avx2 PEER_RUN=$W/peer_run-avx2 ISA_FLAGS=(-DGGML_NATIVE=OFF)
    export SLUICE_ISA=avx2 ;;
  *) fail "ISA=$ISA: native or avx2" ;;
esac

# 1. The source distribution. Its build backend (scikit-build-core) comes as a wheel: pip's
# isolated build of the metadata would otherwise compile CMake from source.
if [ ! -f "$LL/convert_hf_to_gguf.py" ] && [ -n "${SDIST:-}" ]; then
  mkdir -p "$W/src"
  tar -C "$W/src" -xf "$SDIST" || fail "cannot unpack SDIST=$SDIST"
  [ -f "$LL/convert_hf_to_gguf.py" ] || fail "SDIST=$SDIST has no llama_cpp_python-$VERSION/vendor/llama.cpp"
fi
if [ ! -f "$LL/convert_hf_to_gguf.py" ]; then
  python3 -m venv "$W/venv-build" || fail "cannot make a Python venv"
  "$W/venv-build/bin/pip" install -q cmake ninja scikit-build-core \
    || fail "cannot install cmake, ninja and scikit-build-core from PyPI"
  mkdir -p "$W/src"
  (cd "$W/src" && "$W/venv-build/bin/pip" download -q --no-binary :all: --no-deps \
      --no-build-isolation "llama-cpp-python==$VERSION" -d .) \
    || fail "cannot download the llama-cpp-python==$VERSION source distribution from PyPI"
  tar -C "$W/src" -xzf "$W/src/llama_cpp_python-$VERSION.tar.gz" \
    || fail "cannot unpack llama_cpp_python-$VERSION.tar.gz"
  [ -f "$LL/convert_hf_to_gguf.py" ] || fail "the sdist has no vendored llama.cpp at $LL"
fi
grep -q KIMI_K3 "$LL/gguf-py/gguf/constants.py" || fail "the vendored llama.cpp has no Kimi K3"

# 2. The library (CPU only; llama.cpp's default flags, or ISA=avx2's) and the small driver against its C API.
[ -d "$W/venv-build/bin" ] && PATH=$W/venv-build/bin:$PATH
if [ ! -x "$PEER_RUN" ]; then
  # (Only to build: a WORK that already holds peer_run and its libraries needs neither.)
  command -v cmake > /dev/null && command -v ninja > /dev/null \
    || fail "cmake and ninja are needed on PATH to build llama.cpp"
  cmake -S "$LL" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF "${ISA_FLAGS[@]}" \
      -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF > "$BUILD.cmake.log" 2>&1 \
    || fail "cmake configure failed: see $BUILD.cmake.log"
  grep -E "Adding CPU backend variant" "$BUILD.cmake.log" || true
  cmake --build "$BUILD" -j "$JOBS" --target llama > "$BUILD.log" 2>&1 \
    || fail "building llama.cpp failed: see $BUILD.log"
  c++ -O2 -std=c++17 "$HERE/peer_run.cpp" -I"$LL/include" -I"$LL/ggml/include" \
      -L"$BUILD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$BUILD/bin" -o "$PEER_RUN" \
    || fail "compiling tools/peer/peer_run.cpp against llama.cpp failed"
fi

# 3. The converter's Python side: its vendored requirements, less `gguf` (the converter puts its
# vendored gguf-py first on sys.path: the PyPI gguf may predate Kimi K3) plus gguf-py's own
# dependencies. torch: the converter imports it; a torch already installed is used (the
# requirements name a CPU index this machine cannot reach), else PyPI's.
CONVERT_PY=$W/venv-convert/bin/python
if [ -n "${PEER_PYTHON:-}" ]; then
  CONVERT_PY=$(command -v "$PEER_PYTHON") || fail "PEER_PYTHON=$PEER_PYTHON is not a command"
  "$CONVERT_PY" -c 'import torch, numpy, sentencepiece, transformers, yaml, tqdm' \
    || fail "PEER_PYTHON=$PEER_PYTHON lacks a package the converter imports (above)"
elif [ ! -x "$CONVERT_PY" ]; then
  python3 -m venv --system-site-packages "$W/venv-convert" || fail "cannot make a Python venv"
  grep -v -E '^(gguf|-r|--)' "$LL/requirements/requirements-convert_legacy_llama.txt" \
    > "$W/requirements-convert.txt"
  "$W/venv-convert/bin/pip" install -q -r "$W/requirements-convert.txt" tqdm pyyaml requests \
    || fail "cannot install the converter's requirements"
  "$W/venv-convert/bin/python" -c 'import torch' 2>/dev/null \
    || "$W/venv-convert/bin/pip" install -q torch || fail "cannot install torch"
fi

# 4. The slice and its conversion.
MODEL=$W/model GGUF=$W/model-$OUTTYPE.gguf
if [ ! -f "$MODEL/config.json" ]; then
  EXPERTS_ARG=(--experts "$EXPERTS")
  [[ $PRESET == qwen3-* ]] && EXPERTS_ARG=()
  "$SLUICE" synth --out "$MODEL" --preset "$PRESET" --layers "$LAYERS" "${EXPERTS_ARG[@]}" \
      --ranks "$RANKS" || fail "sluice synth failed"
fi
if [ ! -f "$GGUF" ]; then
  # convert_slice.py: llama.cpp's converter with only set_vocab replaced (the slice's synthetic
  # tokenizer has no remote code to load; see that file).
  "$CONVERT_PY" "$HERE/convert_slice.py" "$LL" "$MODEL" --outfile "$GGUF.tmp" \
      --outtype "$OUTTYPE" > "$W/convert.log" 2>&1 \
    || { tail -20 "$W/convert.log" >&2; fail "llama.cpp's converter failed on the slice: see $W/convert.log"; }
  mv "$GGUF.tmp" "$GGUF"
  grep -E "MXFP4|Model successfully exported" "$W/convert.log" | tail -4 || true
fi

# 5. Both engines, interleaved.
PARTS=()
[ "$PRESET" = k3-slice ] || { PARTS=(--parts decode,prefill); ROOFLINE=0; }
python3 "$HERE/peer_bench.py" --sluice "$SLUICE" --model "$MODEL" --gguf "$GGUF" \
    --peer-run "$PEER_RUN" --threads "$THREADS" --out "$W/peer-bench.json" "${PARTS[@]}" "$@" \
  | tee "$W/peer-bench.md" || fail "the benchmark failed"
echo "peer_bench.sh: every run in $W/peer-bench.json"

# 6. The prefill roofline: sluice's FMA peak and T=256 kernel rates (its own probe), the f32,
# bf16 and int8 dot-product peaks of the same core (dot_peak.c), the slice's FLOPs.
if [ "${ROOFLINE:-1}" = 1 ]; then
  cc -O2 -o "$W/dot_peak" "$HERE/dot_peak.c" -lpthread || fail "compiling tools/peer/dot_peak.c failed"
  "$W/dot_peak" "$THREADS" 5 > "$W/dot-peak.json" || fail "dot_peak failed"
  "$SLUICE" probe --model "$MODEL" --kernels --json --threads "$THREADS" \
      --seconds "${PROBE_SECONDS:-20}" --bytes 256M > "$W/probe.json" || fail "sluice probe --kernels failed"
  python3 "$HERE/roofline.py" --model "$MODEL" --bench "$W/peer-bench.json" \
      --probe "$W/probe.json" --dot "$W/dot-peak.json" --out "$W/roofline.json" \
    | tee -a "$W/peer-bench.md" || fail "roofline.py failed"
fi
if [ "${KEEP:-0}" != 1 ]; then rm -rf "$MODEL" "$GGUF"; fi
