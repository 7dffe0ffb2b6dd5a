/* towerpack gpu: bf16 products on the CPU (cpu_bf16.h). */
#include <immintrin.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include <towerpack/log.h>
#include <towerpack/tensor.h>
#include "gpu/cpu/cpu_bf16.h"

/* -1: not asked yet ($TP_CPU_BF16 decides on first use), else 0 or 1 */
static atomic_int s_asked = -1;

static int s_cpu_has_bf16(void) {
    static atomic_int has = -1;
    int h = atomic_load(&has);
    if (h < 0) {
        const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
        h = ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) ==
            (unsigned)dnnl_cpu_isa_avx512_core_bf16;
        atomic_store(&has, h);
    }
    return h;
}

int tp_backend_cpu_bf16(int on) {
    atomic_store(&s_asked, on != 0);
    return on && s_cpu_has_bf16();
}

int tp_backend_cpu_bf16_ask(int bf16) {
    if (bf16 < 0)
        return tp_cpu_bf16_on();
    if (tp_backend_cpu_bf16(bf16)) {
        TP_INFO("bf16: the CPU's matrix products on bf16 operands, fp32 sums; its "
                "direct convolutions on bf16 inputs; the fused attention's tile products "
                "on bf16 operands");
        return 1;
    }
    if (bf16)
        TP_WARN("bf16: this CPU has no bf16 dot products (AVX512_BF16 or AMX, as "
                "oneDNN reads it): the products stay fp32");
    return 0;
}

int tp_cpu_bf16_on(void) {
    int asked = atomic_load(&s_asked);
    if (asked < 0) {
        const char *e = getenv("TP_CPU_BF16");
        asked = e && *e && strcmp(e, "0") != 0;
        atomic_store(&s_asked, asked);
    }
    return asked && s_cpu_has_bf16();
}

/* Thirty-two at a time where the CPU converts (one VCVTNE2PS2BF16 of two
 * registers of sixteen; it rounds to nearest even and keeps NaNs NaNs, as
 * tp_f32_to_bf16); the rest, and every element elsewhere, one by one. */
__attribute__((target("avx512f,avx512bf16"))) static size_t s_convert_avx512(uint16_t *dst,
                                                                               const float *src,
                                                                               size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 lo = _mm512_loadu_ps(src + i), hi = _mm512_loadu_ps(src + i + 16);
        _mm512_storeu_si512((void *)(dst + i), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    return i;
}

void tp_cpu_f32_to_bf16(uint16_t *dst, const float *src, size_t n) {
    static atomic_int simd = -1;
    int v = atomic_load(&simd);
    if (v < 0)
        atomic_store(&simd, v = __builtin_cpu_supports("avx512bf16") != 0);
    size_t i = v ? s_convert_avx512(dst, src, n) : 0;
    for (; i < n; i++)
        dst[i] = tp_f32_to_bf16(src[i]);
}
