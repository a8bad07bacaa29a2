/* Run-time CPU feature detection (the CPU flag AND the OS support for its state), the
 * one list of ISAs (dp_isas) and the dispatch between them. */
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
              avx512vl = (ebx >> 31) & 1, avx512vnni = (ecx >> 11) & 1;
    if (ymm_os && avx2 && fma && f16c) f |= DP_CPU_AVX2;
    if (zmm_os && (f & DP_CPU_AVX2) && avx512f && avx512bw && avx512vl) f |= DP_CPU_AVX512;
    if ((f & DP_CPU_AVX512) && avx512vnni) f |= DP_CPU_AVX512_VNNI;
    /* leaf 7 subleaf 1, EAX bit 4: AVX-VNNI (VEX-encoded; YMM state suffices) */
    if ((f & DP_CPU_AVX2) && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && ((eax >> 4) & 1))
        f |= DP_CPU_AVX_VNNI;
    return f;
}
#elif defined(__aarch64__)
#include <sys/auxv.h>
/* The bits as Linux's arch/arm64 uapi hwcap.h numbers them (Android's bionic the same);
 * older C libraries' headers may lack the names. */
#ifndef HWCAP_ASIMDHP
#define HWCAP_ASIMDHP (1 << 10)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef AT_HWCAP2
#define AT_HWCAP2 26
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif
static unsigned detect(void) {
    unsigned f = DP_CPU_NEON; /* Advanced SIMD is mandatory on AArch64 */
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    if (hw & HWCAP_ASIMDHP) f |= DP_CPU_NEON_FP16;
    if (hw & HWCAP_ASIMDDP) f |= DP_CPU_NEON_DOTPROD;
    if (hw2 & HWCAP2_I8MM) f |= DP_CPU_NEON_I8MM;
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

#if defined(__x86_64__) || defined(_M_X64)
#define X86_OPS(ops) (ops)
#define ARM_OPS(ops) NULL
#elif defined(__aarch64__)
#define X86_OPS(ops) NULL
#define ARM_OPS(ops) (ops)
#else
#define X86_OPS(ops) NULL
#define ARM_OPS(ops) NULL
#endif

/* Adding an ISA: its row here, its ops table (in the attention file whose kernels it
 * shares, or an attn_<isa>.c), its sources in setup.py (and tests/c/build_and_run.sh),
 * its DP_CPU_* bit and detection above. A row needs every feature of the rows before it
 * on its architecture that its ops use; disabling a feature turns off every row that
 * needs it. */
const dp_isa dp_isas[] = {
    {"generic", 0, 0, &dp_ops_generic},
    {"avx2", DP_CPU_AVX2, DP_CPU_AVX2, X86_OPS(&dp_ops_avx2)},
    {"avx_vnni", DP_CPU_AVX_VNNI, DP_CPU_AVX2 | DP_CPU_AVX_VNNI, X86_OPS(&dp_ops_avx_vnni)},
    {"avx512", DP_CPU_AVX512, DP_CPU_AVX2 | DP_CPU_AVX512, X86_OPS(&dp_ops_avx512)},
    {"avx512_vnni", DP_CPU_AVX512_VNNI, DP_CPU_AVX2 | DP_CPU_AVX512 | DP_CPU_AVX512_VNNI, X86_OPS(&dp_ops_avx512_vnni)},
    {"neon", DP_CPU_NEON, DP_CPU_NEON, ARM_OPS(&dp_ops_neon)},
    {"neon_fp16", DP_CPU_NEON_FP16, DP_CPU_NEON | DP_CPU_NEON_FP16, ARM_OPS(&dp_ops_neon_fp16)},
    {"neon_dotprod", DP_CPU_NEON_DOTPROD, DP_CPU_NEON | DP_CPU_NEON_FP16 | DP_CPU_NEON_DOTPROD,
     ARM_OPS(&dp_ops_neon_dotprod)},
    {"neon_i8mm", DP_CPU_NEON_I8MM, DP_CPU_NEON | DP_CPU_NEON_FP16 | DP_CPU_NEON_DOTPROD | DP_CPU_NEON_I8MM,
     ARM_OPS(&dp_ops_neon_i8mm)},
};
const int dp_num_isas = (int)(sizeof dp_isas / sizeof dp_isas[0]);

int dp_parse_features(const char *list, unsigned *mask, const char **bad, size_t *bad_len) {
    *mask = 0;
    for (const char *p = list; p && *p;) {
        p += strspn(p, ", ");
        const size_t len = strcspn(p, ", ");
        if (!len) break;
        int i = 0;
        while (i < dp_num_isas && !(dp_isas[i].feature && strlen(dp_isas[i].name) == len &&
                                    !strncmp(dp_isas[i].name, p, len)))
            i++;
        if (i == dp_num_isas) {
            *bad = p;
            *bad_len = len;
            return DP_ERR_ARG;
        }
        *mask |= dp_isas[i].feature;
        p += len;
    }
    return DP_OK;
}

static const dp_attn_ops *best_ops(unsigned disabled) {
    const unsigned f = dp_cpu_features() & ~disabled;
    for (int i = dp_num_isas - 1; i > 0; i--)
        if (dp_isas[i].ops && (f & dp_isas[i].needs) == dp_isas[i].needs) return dp_isas[i].ops;
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
    for (int i = 0; i < dp_num_isas; i++) {
        if (strcmp(name, dp_isas[i].name) || !dp_isas[i].ops || (f & dp_isas[i].needs) != dp_isas[i].needs) continue;
        if (dp_isas[i].ops == &dp_ops_generic) dp_ops_generic_prepare();
        return dp_isas[i].ops;
    }
    return NULL;
}

const char *dp_ops_name(const dp_attn_ops *ops) {
    for (int i = 0; i < dp_num_isas; i++)
        if (ops && dp_isas[i].ops == ops) return dp_isas[i].name;
    return "?";
}
