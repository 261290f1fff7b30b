/*
 * h3_core.c - H3 Director's hot host-side paths, in one dependency-free C11 file (libc, libm,
 * pthreads). Python calls it through ctypes (h3director/native/_c.py); a numpy module
 * (_fallback.py) computes the same bytes where this library cannot be built.
 *
 * Design
 * ------
 * 1. Frame packing (h3_pack_frames): decoded video, float32/float16/bfloat16, addressed by four
 *    element strides (channel, frame, row, column) so any view can be read in place, becomes
 *    uint8 [F, H, W, C] in one pass. Per value, in float32 and in this order:
 *        v = x * std[c]; v = v + mean[c]; clamp to [0, 1] (NaN -> 0); v = v * 255;
 *        round half to even; store as uint8.
 *    That is exactly PyTorch's `((x.float() * std + mean).clamp(0, 1) * 255).round().to(uint8)`:
 *    separate multiply and add (the build uses -ffp-contract=off so no FMA fuses them), and the
 *    rounding adds and subtracts 2^23, which rounds half to even for 0 <= v < 2^23 in the default
 *    rounding mode (-fno-trapping-math only lets the compiler turn the clamps into branch-free
 *    selects; no value changes). Rows are processed in chunks of CHUNK values per channel through a small
 *    stack buffer, so loops are simple, stride-1 and vectorisable. Frames are split over
 *    `threads` pthreads.
 *
 * 2. GGUF dequantisation (h3_dequantize): ggml block formats Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
 *    Q5_K, Q6_K to float32 with the operation order of the gguf package's numpy reference
 *    (`gguf.quants`), so results are bit-identical; float16 and bfloat16 outputs are those
 *    float32 values rounded to nearest, ties to even (float16 like numpy's astype, bfloat16 like
 *    PyTorch's vectorised CPU cast, which writes 0xFFFF for every NaN). float16 -> float32 uses a
 *    65536-entry table built once.
 *
 * 3. Arena (h3_arena_*): one anonymous mmap, sub-allocated in multiples of `alignment` bytes.
 *    Block metadata lives outside the region (so pages stay untouched and can be madvised away),
 *    in a node array addressed by index. Free blocks sit in 64 power-of-two size bins with a
 *    bitmap of non-empty bins: allocation takes the first block of the lowest non-empty bin whose
 *    every block fits (one find-first-set), falling back to a first-fit walk of the request's own
 *    bin; freeing coalesces with both address neighbours. Both are O(1) for the fixed-size
 *    (slot) pattern of decode buffers. A handle is (generation << 32 | node index), so a stale
 *    or forged handle is rejected instead of freeing someone else's block. One mutex per arena.
 *
 * Safety: every entry point checks its pointers and sizes (the caller passes the byte size of
 * every buffer) and returns a negative H3_E* code instead of touching memory it was not given.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef H3_ABI_VERSION /* overridable only so a test can build a mismatching library */
#define H3_ABI_VERSION 1u
#endif

enum { H3_OK = 0, H3_EINVAL = -1, H3_ESIZE = -2, H3_ENOMEM = -3, H3_ENOENT = -4 };
enum { H3_F32 = 0, H3_F16 = 1, H3_BF16 = 2 };
enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

#define H3_MAX_THREADS 256

typedef struct h3_arena h3_arena;
void h3_arena_destroy(h3_arena *a);
#define CHUNK 512
#define QK_K 256

uint32_t h3_abi_version(void) { return H3_ABI_VERSION; }

const char *h3_strerror(int code) {
    switch (code) {
    case H3_OK: return "ok";
    case H3_EINVAL: return "invalid argument";
    case H3_ESIZE: return "buffer size does not match the shape";
    case H3_ENOMEM: return "out of memory";
    case H3_ENOENT: return "no such allocation";
    default: return "unknown error";
    }
}

/* ---------------------------------------------------------------------------------------------
 * Scalar conversions */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static float f16_table[65536];
static pthread_once_t f16_once = PTHREAD_ONCE_INIT;

static float f16_to_f32_slow(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) /* inf, or NaN made quiet as the hardware converters do */
        return bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u));
    if (exp != 0) return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
    return bits_f32(sign | f32_bits((float)man * 0x1p-24f)); /* zero or subnormal: exact */
}

static void f16_table_init(void) {
    for (uint32_t h = 0; h < 65536u; h++) f16_table[h] = f16_to_f32_slow((uint16_t)h);
}

static inline float f16_to_f32(uint16_t h) { return f16_table[h]; }

static inline uint16_t f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* quiet NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to infinity */
    if (ax >= 0x38800000u) {                                    /* normal half */
        uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    if (ax <= 0x33000000u) return sign; /* <= 2^-25 rounds (ties to even) to zero */
    uint32_t shift = 126u - (ax >> 23);  /* 14..24: value = m * 2^-24 after the shift */
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0xffffu;
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* ---------------------------------------------------------------------------------------------
 * A tiny fork-join helper: run fn(ctx, begin, end) over [0, n) split into `threads` ranges. */

typedef void (*range_fn)(void *ctx, int64_t begin, int64_t end);
typedef struct { range_fn fn; void *ctx; int64_t begin, end; } range_job;

static void *range_thread(void *arg) {
    range_job *job = (range_job *)arg;
    job->fn(job->ctx, job->begin, job->end);
    return NULL;
}

static void parallel_for(range_fn fn, void *ctx, int64_t n, int threads) {
    if (threads > n) threads = (int)n;
    if (threads <= 1) { if (n > 0) fn(ctx, 0, n); return; }
    range_job jobs[H3_MAX_THREADS];
    pthread_t tids[H3_MAX_THREADS];
    int started[H3_MAX_THREADS];
    for (int t = 0; t < threads; t++) {
        jobs[t].fn = fn; jobs[t].ctx = ctx;
        jobs[t].begin = n * t / threads; jobs[t].end = n * (t + 1) / threads;
        started[t] = t > 0 && pthread_create(&tids[t], NULL, range_thread, &jobs[t]) == 0;
    }
    for (int t = 0; t < threads; t++) /* range 0, and any thread that failed to start, run here */
        if (!started[t]) fn(ctx, jobs[t].begin, jobs[t].end);
    for (int t = 1; t < threads; t++)
        if (started[t]) pthread_join(tids[t], NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Frame packing */

typedef struct {
    const unsigned char *src; /* byte address of element (0, 0, 0, 0) */
    int dtype;
    int64_t channels, frames, height, width;
    int64_t sc, sf, sh, sw; /* element strides */
    const float *mean, *std;
    uint8_t *dst;
} pack_job;

static void load_f32(const pack_job *j, int64_t elem, int64_t n, float *restrict out) {
    if (j->dtype == H3_F32) {
        const float *p = (const float *)j->src + elem;
        if (j->sw == 1) memcpy(out, p, (size_t)n * 4);
        else for (int64_t i = 0; i < n; i++) out[i] = p[i * j->sw];
    } else if (j->dtype == H3_F16) {
        const uint16_t *p = (const uint16_t *)j->src + elem;
        for (int64_t i = 0; i < n; i++) out[i] = f16_to_f32(p[i * j->sw]);
    } else {
        const uint16_t *p = (const uint16_t *)j->src + elem;
        for (int64_t i = 0; i < n; i++) out[i] = bits_f32((uint32_t)p[i * j->sw] << 16);
    }
}

static void affine_to_u8(const float *restrict x, int64_t n, float s, float m, uint8_t *restrict y) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i] * s;
        v = v + m;
        v = v >= 0.0f ? v : 0.0f; /* also maps NaN to 0 */
        v = v <= 1.0f ? v : 1.0f;
        v = v * 255.0f;
        v = (v + 0x1p23f) - 0x1p23f; /* round half to even: 0 <= v <= 255 */
        y[i] = (uint8_t)(int32_t)v;
    }
}

static void pack_range(void *ctx, int64_t f0, int64_t f1) {
    const pack_job *j = (const pack_job *)ctx;
    const int64_t C = j->channels;
    float buf[CHUNK];
    uint8_t planes[4][CHUNK];
    for (int64_t f = f0; f < f1; f++) {
        for (int64_t h = 0; h < j->height; h++) {
            uint8_t *row = j->dst + ((f * j->height + h) * j->width) * C;
            for (int64_t w0 = 0; w0 < j->width; w0 += CHUNK) {
                int64_t n = j->width - w0 < CHUNK ? j->width - w0 : CHUNK;
                uint8_t *out = row + w0 * C;
                for (int64_t c0 = 0; c0 < C; c0 += 4) {
                    int64_t cn = C - c0 < 4 ? C - c0 : 4;
                    for (int64_t k = 0; k < cn; k++) {
                        int64_t c = c0 + k;
                        load_f32(j, c * j->sc + f * j->sf + h * j->sh + w0 * j->sw, n, buf);
                        affine_to_u8(buf, n, j->std[c], j->mean[c], planes[k]);
                    }
                    if (C == 3) {
                        for (int64_t i = 0; i < n; i++) {
                            out[3 * i] = planes[0][i]; out[3 * i + 1] = planes[1][i]; out[3 * i + 2] = planes[2][i];
                        }
                    } else if (C == 1) {
                        memcpy(out, planes[0], (size_t)n);
                    } else {
                        for (int64_t i = 0; i < n; i++)
                            for (int64_t k = 0; k < cn; k++) out[i * C + c0 + k] = planes[k][i];
                    }
                }
            }
        }
    }
}

/* Smallest and largest element offset a strided 4-D view touches (all sizes >= 1); 0 on overflow. */
static int strided_extent(const int64_t *size, const int64_t *stride, int64_t *lo, int64_t *hi) {
    *lo = 0; *hi = 0;
    for (int d = 0; d < 4; d++) {
        int64_t reach;
        if (__builtin_mul_overflow(size[d] - 1, stride[d], &reach)) return 0;
        if (__builtin_add_overflow(reach < 0 ? *lo : *hi, reach, reach < 0 ? lo : hi)) return 0;
    }
    return 1;
}

/* src_lo/src_hi: the element offsets (relative to src) the caller guarantees readable, [lo, hi). */
int h3_pack_frames(const void *src, int dtype, int64_t src_lo, int64_t src_hi,
                   int64_t channels, int64_t frames, int64_t height, int64_t width,
                   int64_t stride_c, int64_t stride_f, int64_t stride_h, int64_t stride_w,
                   const float *mean, const float *std, int64_t n_affine,
                   uint8_t *dst, int64_t dst_nbytes, int threads) {
    if (!mean || !std) return H3_EINVAL;
    if (dtype != H3_F32 && dtype != H3_F16 && dtype != H3_BF16) return H3_EINVAL;
    if (channels <= 0 || frames < 0 || height < 0 || width < 0 || threads < 1 || threads > H3_MAX_THREADS)
        return H3_EINVAL;
    if (n_affine != channels) return H3_ESIZE;
    const int64_t lim = INT64_C(1) << 40;
    if (channels > lim || frames > lim || height > lim || width > lim) return H3_ESIZE;
    int64_t sizes[4] = {channels, frames, height, width}, strides[4] = {stride_c, stride_f, stride_h, stride_w};
    for (int d = 0; d < 4; d++)
        if (strides[d] > lim || strides[d] < -lim) return H3_ESIZE;
    /* output size, overflow-checked */
    int64_t total = channels;
    for (int d = 1; d < 4; d++) {
        if (sizes[d] != 0 && total > INT64_MAX / sizes[d]) return H3_ESIZE;
        total *= sizes[d];
    }
    if (total != dst_nbytes) return H3_ESIZE;
    if (total == 0) return H3_OK;
    if (!src || !dst) return H3_EINVAL;
    int64_t lo, hi;
    if (!strided_extent(sizes, strides, &lo, &hi) || lo < src_lo || hi >= src_hi) return H3_ESIZE;
    pthread_once(&f16_once, f16_table_init);
    pack_job job = {(const unsigned char *)src, dtype, channels, frames, height, width,
                    stride_c, stride_f, stride_h, stride_w, mean, std, dst};
    parallel_for(pack_range, &job, frames, threads);
    return H3_OK;
}

/* ---------------------------------------------------------------------------------------------
 * GGUF dequantisation: one block -> float32 y[block_values], in gguf.quants' operation order. */

static inline float rd_f16(const uint8_t *p) { return f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

static void dq_q8_0(const uint8_t *restrict b, float *restrict y) {
    const float d = rd_f16(b);
    for (int i = 0; i < 32; i++) y[i] = (float)(int8_t)b[2 + i] * d;
}

static void dq_q4_0(const uint8_t *restrict b, float *restrict y) {
    const float d = rd_f16(b);
    for (int i = 0; i < 16; i++) {
        y[i] = d * (float)((b[2 + i] & 0x0f) - 8);
        y[i + 16] = d * (float)((b[2 + i] >> 4) - 8);
    }
}

static void dq_q4_1(const uint8_t *restrict b, float *restrict y) {
    const float d = rd_f16(b), m = rd_f16(b + 2);
    for (int i = 0; i < 16; i++) {
        y[i] = d * (float)(b[4 + i] & 0x0f) + m;
        y[i + 16] = d * (float)(b[4 + i] >> 4) + m;
    }
}

static inline uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void q5_values(const uint8_t *qh_bytes, const uint8_t *qs, int *restrict q) {
    const uint32_t qh = rd_u32(qh_bytes);
    for (int i = 0; i < 16; i++) {
        q[i] = (qs[i] & 0x0f) | (int)(((qh >> i) & 1u) << 4);
        q[i + 16] = (qs[i] >> 4) | (int)(((qh >> (i + 16)) & 1u) << 4);
    }
}

static void dq_q5_0(const uint8_t *restrict b, float *restrict y) {
    const float d = rd_f16(b);
    int q[32];
    q5_values(b + 2, b + 6, q);
    for (int i = 0; i < 32; i++) y[i] = d * (float)(q[i] - 16);
}

static void dq_q5_1(const uint8_t *restrict b, float *restrict y) {
    const float d = rd_f16(b), m = rd_f16(b + 2);
    int q[32];
    q5_values(b + 4, b + 8, q);
    for (int i = 0; i < 32; i++) y[i] = d * (float)q[i] + m;
}

/* Q4_K / Q5_K: 8 sub-blocks of 32 values, 6-bit scales and mins packed in 12 bytes. */
static void k_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K (qh == NULL) and Q5_K (a fifth bit per value from qh): y = (d * scale) * q - (dmin * min). */
static inline void dq_k_quant(const uint8_t *restrict b, const uint8_t *restrict qs, const uint8_t *restrict qh,
                              float *restrict y) {
    const float d = rd_f16(b), dmin = rd_f16(b + 2);
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        k_scale_min(b + 4, j, &sc, &mn);
        const float dl = d * (float)sc, ml = dmin * (float)mn;
        const uint8_t *q = qs + 32 * (j / 2);
        const int shift = 4 * (j & 1);
        for (int l = 0; l < 32; l++) {
            int v = (q[l] >> shift) & 0x0f;
            if (qh) v |= ((qh[l] >> j) & 1) << 4;
            y[32 * j + l] = dl * (float)v - ml;
        }
    }
}

static void dq_q4_k(const uint8_t *restrict b, float *restrict y) { dq_k_quant(b, b + 16, NULL, y); }

static void dq_q5_k(const uint8_t *restrict b, float *restrict y) { dq_k_quant(b, b + 48, b + 16, y); }

/* 32 values of a Q6_K half-block: low nibbles from lo (>> lo_shift), two high bits from qh (>> hi_shift);
 * the first 16 use scale dl0, the next 16 dl1. Inlined with constant shifts so the loop vectorises. */
static inline void q6_group(const uint8_t *restrict lo, int lo_shift, const uint8_t *restrict qh, int hi_shift,
                            float dl0, float dl1, float *restrict out) {
    for (int l = 0; l < 32; l++) {
        int q = ((lo[l] >> lo_shift) & 0x0f) | (((qh[l] >> hi_shift) & 3) << 4);
        out[l] = (l < 16 ? dl0 : dl1) * (float)(q - 32);
    }
}

static void dq_q6_k(const uint8_t *restrict b, float *restrict y) {
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = rd_f16(b + 208);
    for (int half = 0; half < 2; half++) { /* value 128*half + 32*s + l, scale index 8*half + 2*s + l/16 */
        const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
        const int8_t *s8 = sc + 8 * half;
        float *o = y + 128 * half;
        q6_group(ql, 0, qh, 0, d * (float)s8[0], d * (float)s8[1], o);
        q6_group(ql + 32, 0, qh, 2, d * (float)s8[2], d * (float)s8[3], o + 32);
        q6_group(ql, 4, qh, 4, d * (float)s8[4], d * (float)s8[5], o + 64);
        q6_group(ql + 32, 4, qh, 6, d * (float)s8[6], d * (float)s8[7], o + 96);
    }
}

typedef void (*dq_fn)(const uint8_t *, float *);

static int quant_info(int qtype, int *values, int *bytes, dq_fn *fn) {
    switch (qtype) {
    case Q8_0: *values = 32; *bytes = 34; *fn = dq_q8_0; return 1;
    case Q4_0: *values = 32; *bytes = 18; *fn = dq_q4_0; return 1;
    case Q4_1: *values = 32; *bytes = 20; *fn = dq_q4_1; return 1;
    case Q5_0: *values = 32; *bytes = 22; *fn = dq_q5_0; return 1;
    case Q5_1: *values = 32; *bytes = 24; *fn = dq_q5_1; return 1;
    case Q4_K: *values = QK_K; *bytes = 144; *fn = dq_q4_k; return 1;
    case Q5_K: *values = QK_K; *bytes = 176; *fn = dq_q5_k; return 1;
    case Q6_K: *values = QK_K; *bytes = 210; *fn = dq_q6_k; return 1;
    default: return 0;
    }
}

typedef struct {
    dq_fn fn;
    int values, bytes, dtype;
    const uint8_t *src;
    void *dst;
} dq_job;

static void dq_range(void *ctx, int64_t b0, int64_t b1) {
    const dq_job *j = (const dq_job *)ctx;
    float tmp[QK_K];
    for (int64_t blk = b0; blk < b1; blk++) {
        const uint8_t *b = j->src + blk * j->bytes;
        if (j->dtype == H3_F32) {
            j->fn(b, (float *)j->dst + blk * j->values);
            continue;
        }
        j->fn(b, tmp);
        uint16_t *o = (uint16_t *)j->dst + blk * j->values;
        if (j->dtype == H3_F16) for (int i = 0; i < j->values; i++) o[i] = f32_to_f16(tmp[i]);
        else for (int i = 0; i < j->values; i++) o[i] = f32_to_bf16(tmp[i]);
    }
}

int h3_quant_block_size(int qtype, int64_t *values, int64_t *bytes) {
    int v, b;
    dq_fn fn;
    if (!values || !bytes || !quant_info(qtype, &v, &b, &fn)) return H3_EINVAL;
    *values = v; *bytes = b;
    return H3_OK;
}

int h3_dequantize(int qtype, const uint8_t *src, int64_t src_nbytes, void *dst, int dtype,
                  int64_t dst_nbytes, int threads) {
    int values, bytes;
    dq_fn fn;
    if (!quant_info(qtype, &values, &bytes, &fn)) return H3_EINVAL;
    if (dtype != H3_F32 && dtype != H3_F16 && dtype != H3_BF16) return H3_EINVAL;
    if (threads < 1 || threads > H3_MAX_THREADS || src_nbytes < 0 || dst_nbytes < 0) return H3_EINVAL;
    if (src_nbytes % bytes) return H3_ESIZE;
    const int64_t blocks = src_nbytes / bytes;
    const int64_t out_size = dtype == H3_F32 ? 4 : 2;
    if (blocks > INT64_MAX / (values * out_size) || blocks * values * out_size != dst_nbytes) return H3_ESIZE;
    if (blocks == 0) return H3_OK;
    if (!src || !dst) return H3_EINVAL;
    pthread_once(&f16_once, f16_table_init);
    dq_job job = {fn, values, bytes, dtype, src, dst};
    parallel_for(dq_range, &job, blocks, threads);
    return H3_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Arena */

#define NBINS 64
#define NIL (-1)

typedef struct {
    uint64_t off, size;
    int32_t prev_addr, next_addr; /* neighbours in address order (NIL at the ends) */
    int32_t prev_free, next_free; /* bin list links while free; next_free links spare nodes */
    uint32_t gen;
    uint8_t used, in_bin;
} h3_node;

typedef struct {
    uint64_t capacity, used, free, high_water, largest_free, free_blocks, live, total_allocs, failed_allocs;
} h3_arena_stats_t;

struct h3_arena {
    pthread_mutex_t lock;
    void *map;
    size_t map_len;
    uint8_t *base;
    uint64_t capacity, alignment, release_threshold, page;
    h3_node *nodes;
    int32_t n_nodes, cap_nodes, spare; /* spare: head of recycled nodes */
    int32_t bins[NBINS];
    uint64_t bin_mask;
    uint64_t used, high_water, live, total_allocs, failed_allocs;
};

static inline int bin_of(uint64_t size) { return 63 - __builtin_clzll(size); }

static void bin_insert(h3_arena *a, int32_t i) {
    h3_node *n = &a->nodes[i];
    int b = bin_of(n->size);
    n->prev_free = NIL;
    n->next_free = a->bins[b];
    if (a->bins[b] != NIL) a->nodes[a->bins[b]].prev_free = i;
    a->bins[b] = i;
    a->bin_mask |= UINT64_C(1) << b;
    n->in_bin = 1;
}

static void bin_remove(h3_arena *a, int32_t i) {
    h3_node *n = &a->nodes[i];
    int b = bin_of(n->size);
    if (n->prev_free != NIL) a->nodes[n->prev_free].next_free = n->next_free;
    else a->bins[b] = n->next_free;
    if (n->next_free != NIL) a->nodes[n->next_free].prev_free = n->prev_free;
    if (a->bins[b] == NIL) a->bin_mask &= ~(UINT64_C(1) << b);
    n->in_bin = 0;
}

static int32_t node_new(h3_arena *a) {
    if (a->spare != NIL) {
        int32_t i = a->spare;
        a->spare = a->nodes[i].next_free;
        return i;
    }
    if (a->n_nodes == a->cap_nodes) {
        if (a->cap_nodes > INT32_MAX / 2) return NIL;
        int32_t cap = a->cap_nodes ? a->cap_nodes * 2 : 64;
        h3_node *grown = (h3_node *)realloc(a->nodes, (size_t)cap * sizeof(h3_node));
        if (!grown) return NIL;
        a->nodes = grown;
        a->cap_nodes = cap;
    }
    a->nodes[a->n_nodes].gen = 0;
    return a->n_nodes++;
}

static void node_recycle(h3_arena *a, int32_t i) {
    a->nodes[i].gen++;
    a->nodes[i].used = 0;
    a->nodes[i].size = 0;
    a->nodes[i].next_free = a->spare;
    a->spare = i;
}

h3_arena *h3_arena_create(uint64_t capacity, uint64_t alignment, uint64_t release_threshold) {
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) page = 4096;
    if (alignment < 16 || alignment > (UINT64_C(1) << 21) || (alignment & (alignment - 1))) return NULL;
    if (capacity == 0 || capacity % alignment || capacity > (UINT64_C(1) << 46)) return NULL;
    h3_arena *a = (h3_arena *)calloc(1, sizeof(h3_arena));
    if (!a) return NULL;
    uint64_t extra = alignment > (uint64_t)page ? alignment : 0;
    a->map_len = (size_t)(capacity + extra);
    a->map = mmap(NULL, a->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (a->map == MAP_FAILED) { free(a); return NULL; }
    uintptr_t start = ((uintptr_t)a->map + (alignment - 1)) & ~(uintptr_t)(alignment - 1);
    a->base = (uint8_t *)start;
    a->capacity = capacity;
    a->alignment = alignment;
    a->release_threshold = release_threshold;
    a->page = (uint64_t)page;
    a->spare = NIL;
    for (int b = 0; b < NBINS; b++) a->bins[b] = NIL;
    if (pthread_mutex_init(&a->lock, NULL) != 0) { munmap(a->map, a->map_len); free(a); return NULL; }
    int32_t i = node_new(a);
    if (i == NIL) { h3_arena_destroy(a); return NULL; }
    h3_node *n = &a->nodes[i];
    n->off = 0; n->size = capacity; n->prev_addr = n->next_addr = NIL; n->used = 0;
    bin_insert(a, i);
    return a;
}

void h3_arena_destroy(h3_arena *a) {
    if (!a) return;
    pthread_mutex_destroy(&a->lock);
    munmap(a->map, a->map_len);
    free(a->nodes);
    free(a);
}

void *h3_arena_base(h3_arena *a) { return a ? a->base : NULL; }

/* On success stores the handle and the block's byte offset from h3_arena_base(). */
int h3_arena_alloc(h3_arena *a, uint64_t nbytes, uint64_t *handle, uint64_t *offset) {
    if (!a || !handle || !offset || nbytes == 0) return H3_EINVAL;
    if (nbytes > a->capacity) return H3_ENOMEM;
    const uint64_t size = (nbytes + a->alignment - 1) & ~(a->alignment - 1);
    pthread_mutex_lock(&a->lock);
    int32_t found = NIL;
    int fl = bin_of(size);
    uint64_t above = fl >= 63 ? 0 : a->bin_mask & ~((UINT64_C(2) << fl) - 1);
    if (above) {
        found = a->bins[__builtin_ctzll(above)];
    } else {
        for (int32_t i = a->bins[fl]; i != NIL; i = a->nodes[i].next_free)
            if (a->nodes[i].size >= size) { found = i; break; }
    }
    if (found == NIL) {
        a->failed_allocs++;
        pthread_mutex_unlock(&a->lock);
        return H3_ENOMEM;
    }
    bin_remove(a, found);
    if (a->nodes[found].size > size) { /* split: the tail stays free */
        int32_t t = node_new(a);     /* may move a->nodes */
        if (t == NIL) {
            bin_insert(a, found);
            pthread_mutex_unlock(&a->lock);
            return H3_ENOMEM;
        }
        h3_node *n = &a->nodes[found], *tail = &a->nodes[t];
        tail->off = n->off + size;
        tail->size = n->size - size;
        tail->used = 0;
        tail->prev_addr = found;
        tail->next_addr = n->next_addr;
        if (n->next_addr != NIL) a->nodes[n->next_addr].prev_addr = t;
        n->next_addr = t;
        n->size = size;
        bin_insert(a, t);
    }
    h3_node *n = &a->nodes[found];
    n->used = 1;
    a->used += size;
    a->live++;
    a->total_allocs++;
    if (a->used > a->high_water) a->high_water = a->used;
    *handle = ((uint64_t)n->gen << 32) | (uint32_t)found;
    *offset = n->off;
    pthread_mutex_unlock(&a->lock);
    return H3_OK;
}

static void release_pages(h3_arena *a, const h3_node *n) {
    if (!a->release_threshold || n->size < a->release_threshold) return;
    uint64_t lo = (n->off + a->page - 1) & ~(a->page - 1);
    uint64_t hi = (n->off + n->size) & ~(a->page - 1);
    if (hi > lo) madvise(a->base + lo, (size_t)(hi - lo), MADV_DONTNEED);
}

int h3_arena_free(h3_arena *a, uint64_t handle) {
    if (!a) return H3_EINVAL;
    const int32_t i = (int32_t)(uint32_t)(handle & 0xffffffffu);
    const uint32_t gen = (uint32_t)(handle >> 32);
    pthread_mutex_lock(&a->lock);
    if ((handle & 0xffffffffu) > INT32_MAX || i >= a->n_nodes || !a->nodes[i].used || a->nodes[i].gen != gen) {
        pthread_mutex_unlock(&a->lock);
        return H3_ENOENT;
    }
    int32_t keep = i;
    h3_node *n = &a->nodes[i];
    n->used = 0;
    a->used -= n->size;
    a->live--;
    int32_t next = n->next_addr;
    if (next != NIL && !a->nodes[next].used) { /* absorb the next run */
        bin_remove(a, next);
        n->size += a->nodes[next].size;
        n->next_addr = a->nodes[next].next_addr;
        if (n->next_addr != NIL) a->nodes[n->next_addr].prev_addr = i;
        node_recycle(a, next);
    }
    int32_t prev = n->prev_addr;
    if (prev != NIL && !a->nodes[prev].used) { /* the previous run absorbs this one */
        bin_remove(a, prev);
        h3_node *p = &a->nodes[prev];
        p->size += n->size;
        p->next_addr = n->next_addr;
        if (p->next_addr != NIL) a->nodes[p->next_addr].prev_addr = prev;
        node_recycle(a, i);
        keep = prev;
    }
    bin_insert(a, keep);
    release_pages(a, &a->nodes[keep]);
    pthread_mutex_unlock(&a->lock);
    return H3_OK;
}

int h3_arena_stats(h3_arena *a, h3_arena_stats_t *out, int64_t out_size) {
    if (!a || !out || out_size != (int64_t)sizeof(h3_arena_stats_t)) return H3_EINVAL;
    pthread_mutex_lock(&a->lock);
    memset(out, 0, sizeof *out);
    for (int b = 0; b < NBINS; b++) {
        for (int32_t i = a->bins[b]; i != NIL; i = a->nodes[i].next_free) {
            out->free += a->nodes[i].size;
            out->free_blocks++;
            if (a->nodes[i].size > out->largest_free) out->largest_free = a->nodes[i].size;
        }
    }
    out->capacity = a->capacity;
    out->used = a->used;
    out->high_water = a->high_water;
    out->live = a->live;
    out->total_allocs = a->total_allocs;
    out->failed_allocs = a->failed_allocs;
    pthread_mutex_unlock(&a->lock);
    return H3_OK;
}

int64_t h3_arena_stats_size(void) { return (int64_t)sizeof(h3_arena_stats_t); }
