#!/usr/bin/env bash
# Build tests/c/test_kernels.c with every kernel source and run it.
#   tests/c/build_and_run.sh native          this machine, -O2
#   tests/c/build_and_run.sh sanitize        this machine, -fsanitize=address,undefined
#   tests/c/build_and_run.sh aarch64         cross-compiled, run under qemu-aarch64 with
#                                            -cpu max (FP16) and -cpu cortex-a53 (no FP16)
set -euo pipefail
cd "$(dirname "$0")/../.."
S=cython_ext/csrc
OUT=${TMPDIR:-/tmp}/dualpath-ctest
mkdir -p "$OUT"
BASE="$S/kv_arena.c $S/kv_attn.c $S/attn_generic.c $S/cpu_features.c $S/dp_pool.c $S/qmatmul.c $S/lmatmul.c $S/ggml_repack.c tests/c/test_kernels.c"
build() { # $1 = compiler, $2 = output, $3... = extra flags for the base files
    local cc=$1 out=$2; shift 2
    local objs=()
    case "$($cc -dumpmachine)" in
        x86_64*)
            $cc "$@" -c $S/attn_avx2.c -mavx2 -mfma -mf16c -o "$OUT/avx2.o"
            $cc "$@" -c $S/qmatmul_avx2.c -mavx2 -mfma -mf16c -o "$OUT/qavx2.o"
            $cc "$@" -c $S/attn_avx512.c -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c -o "$OUT/avx512.o"
            $cc "$@" -c $S/qmatmul_avx512.c -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c -o "$OUT/qavx512.o"
            $cc "$@" -c $S/lmatmul_avx2.c -mavx2 -mfma -mf16c -o "$OUT/lavx2.o"
            $cc "$@" -c $S/lmatmul_avx512.c -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c -o "$OUT/lavx512.o"
            objs=("$OUT/avx2.o" "$OUT/qavx2.o" "$OUT/avx512.o" "$OUT/qavx512.o" "$OUT/lavx2.o" "$OUT/lavx512.o") ;;
        aarch64*)
            $cc "$@" -c $S/attn_neon.c -o "$OUT/neon.o"
            $cc "$@" -c $S/qmatmul_neon.c -o "$OUT/qneon.o"
            $cc "$@" -c $S/lmatmul_neon.c -o "$OUT/lneon.o"
            $cc "$@" -c $S/attn_neon_fp16.c -march=armv8.2-a+fp16 -o "$OUT/neon_fp16.o"
            objs=("$OUT/neon.o" "$OUT/qneon.o" "$OUT/lneon.o" "$OUT/neon_fp16.o") ;;
    esac
    $cc "$@" $BASE "${objs[@]}" -o "$out" -lm -lpthread
}
case "${1:-native}" in
    native)
        build gcc "$OUT/test_native" -O2 -std=c11 -D_GNU_SOURCE
        "$OUT/test_native" ;;
    sanitize)
        build gcc "$OUT/test_asan" -O1 -g -std=c11 -D_GNU_SOURCE -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
        ASAN_OPTIONS=detect_leaks=1 "$OUT/test_asan" ;;
    aarch64)
        build aarch64-linux-gnu-gcc "$OUT/test_arm" -O2 -std=c11 -D_GNU_SOURCE -static
        echo "== qemu-aarch64 -cpu max (FP16 arithmetic available)"
        qemu-aarch64 -cpu max "$OUT/test_arm" | tee "$OUT/max.log"
        grep -q "dispatch picks neon_fp16" "$OUT/max.log"
        echo "== qemu-aarch64 -cpu cortex-a53 (no FP16: dispatch must fall back, not SIGILL)"
        qemu-aarch64 -cpu cortex-a53 "$OUT/test_arm" | tee "$OUT/a53.log"
        grep -q "dispatch picks neon$" "$OUT/a53.log" ;;
    *) echo "usage: $0 native|sanitize|aarch64" >&2; exit 2 ;;
esac
