#!/usr/bin/env bash
# Build tests/c/test_kernels.c with every kernel source and run it.
#   tests/c/build_and_run.sh native          this machine, -O2
#   tests/c/build_and_run.sh sanitize        this machine, -fsanitize=address,undefined
#   tests/c/build_and_run.sh aarch64         cross-compiled, run under qemu-aarch64 with
#                                            -cpu max (i8mm), cortex-a76 (dotprod, FP16)
#                                            and cortex-a53 (none of them)
set -euo pipefail
cd "$(dirname "$0")/../.."
S=cython_ext/csrc
OUT=${TMPDIR:-/tmp}/dualpath-ctest
mkdir -p "$OUT"
BASE="$S/kv_arena.c $S/kv_attn.c $S/attn_generic.c $S/cpu_features.c $S/dp_pool.c $S/qmatmul.c $S/lmatmul.c $S/enc_attn.c $S/ggml_repack.c tests/c/test_kernels.c"
build() { # $1 = compiler, $2 = output, $3... = extra flags for the base files
    local cc=$1 out=$2; shift 2
    local objs=()
    case "$($cc -dumpmachine)" in
        x86_64*)
            $cc "$@" -c $S/arch/x86/attn_avx2.c -mavx2 -mfma -mf16c -o "$OUT/avx2.o"
            $cc "$@" -c $S/arch/x86/qmatmul_avx2.c -mavx2 -mfma -mf16c -o "$OUT/qavx2.o"
            $cc "$@" -c $S/arch/x86/attn_avx512.c -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c -o "$OUT/avx512.o"
            $cc "$@" -c $S/arch/x86/qmatmul_avx512.c -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c -o "$OUT/qavx512.o"
            $cc "$@" -c $S/arch/x86/lmatmul_avx2.c -mavx2 -mfma -mf16c -o "$OUT/lavx2.o"
            $cc "$@" -c $S/arch/x86/lmatmul_avx512.c -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c -o "$OUT/lavx512.o"
            objs=("$OUT/avx2.o" "$OUT/qavx2.o" "$OUT/avx512.o" "$OUT/qavx512.o" "$OUT/lavx2.o" "$OUT/lavx512.o") ;;
        aarch64*)
            $cc "$@" -c $S/arch/arm/attn_neon.c -o "$OUT/neon.o"
            $cc "$@" -c $S/arch/arm/qmatmul_neon.c -o "$OUT/qneon.o"
            $cc "$@" -c $S/arch/arm/lmatmul_neon.c -o "$OUT/lneon.o"
            $cc "$@" -c $S/arch/arm/attn_neon_fp16.c -march=armv8.2-a+fp16 -o "$OUT/neon_fp16.o"
            $cc "$@" -c $S/arch/arm/lmatmul_neon_dotprod.c -march=armv8.2-a+fp16+dotprod -o "$OUT/lneon_dotprod.o"
            $cc "$@" -c $S/arch/arm/lmatmul_neon_i8mm.c -march=armv8.2-a+fp16+dotprod+i8mm -o "$OUT/lneon_i8mm.o"
            objs=("$OUT/neon.o" "$OUT/qneon.o" "$OUT/lneon.o" "$OUT/neon_fp16.o" "$OUT/lneon_dotprod.o" "$OUT/lneon_i8mm.o") ;;
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
        # Each ARM CPU model with what its kernels may use: dispatch must pick the best
        # and never die with SIGILL on a CPU without an extension.
        for cpu_isa in "max neon_i8mm" "cortex-a76 neon_dotprod" "cortex-a53 neon"; do
            set -- $cpu_isa
            echo "== qemu-aarch64 -cpu $1 (dispatch should pick $2)"
            qemu-aarch64 -cpu "$1" "$OUT/test_arm" | tee "$OUT/$1.log"
            grep -q "dispatch picks $2\$" "$OUT/$1.log" || { echo "FAILED: -cpu $1 did not pick $2"; exit 1; }
        done ;;
    *) echo "usage: $0 native|sanitize|aarch64" >&2; exit 2 ;;
esac
