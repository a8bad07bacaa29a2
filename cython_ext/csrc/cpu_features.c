/* Run-time CPU feature detection: the CPU flag AND the OS support for its state. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strtok_r under -std=c11 */
#endif
#include <stdlib.h>
#include <string.h>
#include "dp_attn_ops.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0)); /* xgetbv */
    return ((uint64_t)hi << 32) | lo;
}

static unsigned detect(void) {
    unsigned eax, ebx, ecx, edx, f = 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
    const int osxsave = (ecx >> 27) & 1, fma = (ecx >> 12) & 1, f16c = (ecx >> 29) & 1, avx = (ecx >> 28) & 1;
    if (!osxsave || !avx) return 0;
    const uint64_t xcr0 = xgetbv0();
    const int ymm_os = (xcr0 & 0x6) == 0x6;            /* XMM + YMM state */
    const int zmm_os = (xcr0 & 0xe6) == 0xe6;          /* + opmask, ZMM_Hi256, Hi16_ZMM */
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return 0;
    const int avx2 = (ebx >> 5) & 1, avx512f = (ebx >> 16) & 1, avx512bw = (ebx >> 30) & 1,
              avx512vl = (ebx >> 31) & 1;
    if (ymm_os && avx2 && fma && f16c) f |= DP_CPU_AVX2;
    if (zmm_os && (f & DP_CPU_AVX2) && avx512f && avx512bw && avx512vl) f |= DP_CPU_AVX512;
    return f;
}
#elif defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDHP
#define HWCAP_ASIMDHP (1 << 10)
#endif
static unsigned detect(void) {
    unsigned f = DP_CPU_NEON; /* Advanced SIMD is mandatory on AArch64 */
    if (getauxval(AT_HWCAP) & HWCAP_ASIMDHP) f |= DP_CPU_NEON_FP16;
    return f;
}
#else
static unsigned detect(void) { return 0; }
#endif

unsigned dp_cpu_features(void) {
    /* Detected once: CPUID traps to the hypervisor in a VM (microseconds), and the
     * kernels are looked up by name on every call that names one. */
    static unsigned cached; /* bit 31: detected */
    unsigned f = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (!(f & 0x80000000u)) {
        f = detect() | 0x80000000u;
        __atomic_store_n(&cached, f, __ATOMIC_RELAXED);
    }
    return f & 0x7fffffffu;
}

unsigned dp_parse_features(const char *list) {
    unsigned mask = 0;
    if (!list) return 0;
    char buf[256], *save = NULL;
    strncpy(buf, list, sizeof buf - 1);
    buf[sizeof buf - 1] = 0;
    for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) { /* reentrant */
        if (!strcmp(tok, "avx2")) mask |= DP_CPU_AVX2;
        else if (!strcmp(tok, "avx512")) mask |= DP_CPU_AVX512;
        else if (!strcmp(tok, "neon")) mask |= DP_CPU_NEON;
        else if (!strcmp(tok, "neon_fp16") || !strcmp(tok, "fp16")) mask |= DP_CPU_NEON_FP16;
    }
    return mask;
}

static const dp_attn_ops *best_ops(unsigned disabled) {
    const unsigned f = dp_cpu_features() & ~disabled;
#if defined(__x86_64__) || defined(_M_X64)
    if (f & DP_CPU_AVX512) return &dp_ops_avx512;
    if (f & DP_CPU_AVX2) return &dp_ops_avx2;
#elif defined(__aarch64__)
    if ((f & DP_CPU_NEON_FP16) && (f & DP_CPU_NEON)) return &dp_ops_neon_fp16;
    if (f & DP_CPU_NEON) return &dp_ops_neon;
#endif
    (void)f;
    return &dp_ops_generic;
}

const dp_attn_ops *dp_select_ops(unsigned disabled) {
    const dp_attn_ops *ops = best_ops(disabled);
    if (ops == &dp_ops_generic) dp_ops_generic_prepare(); /* its table, before it is handed out */
    return ops;
}

const dp_attn_ops *dp_ops_by_name(const char *name) {
    if (!name) return NULL;
    const unsigned f = dp_cpu_features();
    if (!strcmp(name, "generic")) {
        dp_ops_generic_prepare();
        return &dp_ops_generic;
    }
#if defined(__x86_64__) || defined(_M_X64)
    if (!strcmp(name, "avx2") && (f & DP_CPU_AVX2)) return &dp_ops_avx2;
    if (!strcmp(name, "avx512") && (f & DP_CPU_AVX512)) return &dp_ops_avx512;
#elif defined(__aarch64__)
    if (!strcmp(name, "neon") && (f & DP_CPU_NEON)) return &dp_ops_neon;
    if (!strcmp(name, "neon_fp16") && (f & DP_CPU_NEON_FP16)) return &dp_ops_neon_fp16;
#endif
    (void)f;
    return NULL;
}
