/*
 * C test driver for h3director/native/h3_core.c, for AddressSanitizer/UBSan and valgrind runs
 * (tests/native/sanitize.sh). It exercises every entry point, including every documented
 * refusal, and checks results against straightforward scalar formulas:
 *   - pack_frames: each byte vs nearbyintf(clamp(x * std + mean) * 255) (NaN -> 0), all input
 *     dtypes, strided/negative-stride views, 1 and 3 threads;
 *   - dequantize: float16/bfloat16 outputs vs the float32 output rounded by independent code
 *     paths, on random blocks of every type; every size check;
 *   - arena: a random alloc/free trace with overlap, alignment and accounting checks, stale handles.
 * Exit status 0 means every check passed.
 */
#define _GNU_SOURCE
#include <fenv.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct h3_arena h3_arena;
typedef struct {
    uint64_t capacity, used, free, high_water, largest_free, free_blocks, live, total_allocs, failed_allocs;
} h3_arena_stats_t;

uint32_t h3_abi_version(void);
int h3_pack_frames(const void *, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                   int64_t, int64_t, const float *, const float *, int64_t, uint8_t *, int64_t, int);
int h3_dequantize(int, const uint8_t *, int64_t, void *, int, int64_t, int);
int h3_quant_block_size(int, int64_t *, int64_t *);
h3_arena *h3_arena_create(uint64_t, uint64_t, uint64_t);
void h3_arena_destroy(h3_arena *);
void *h3_arena_base(h3_arena *);
int h3_arena_alloc(h3_arena *, uint64_t, uint64_t *, uint64_t *);
int h3_arena_free(h3_arena *, uint64_t);
int h3_arena_stats(h3_arena *, h3_arena_stats_t *, int64_t);

static int failures = 0;
#define CHECK(cond) do { if (!(cond)) { fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17; return rng_state; }

static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static uint8_t ref_pixel(float x, float s, float m) {
    volatile float v = x * s; /* volatile: keep multiply and add separately rounded */
    v = v + m;
    if (!(v >= 0.0f)) v = 0.0f;
    if (v > 1.0f) v = 1.0f;
    return (uint8_t)nearbyintf(v * 255.0f);
}

static float half_to_float(uint16_t h) { /* independent of h3_core's table: via ldexpf */
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

static void test_pack(void) {
    enum { C = 3, F = 4, H = 5, W = 37 };
    const int64_t n = C * F * H * W;
    float *x = malloc(sizeof(float) * n);
    uint16_t *xh = malloc(2 * n), *xb = malloc(2 * n);
    uint8_t *out = malloc(F * H * W * C);
    const float mean[C] = {0.485f, 0.456f, 0.406f}, std[C] = {0.229f, 0.224f, 0.225f};
    for (int64_t i = 0; i < n; i++) {
        uint32_t r = (uint32_t)rnd();
        x[i] = (float)((int32_t)r % 4000) / 700.0f;
        if (i % 97 == 0) x[i] = NAN;
        if (i % 89 == 0) x[i] = (i & 1) ? INFINITY : -INFINITY;
        xh[i] = (uint16_t)rnd();
        xb[i] = (uint16_t)rnd();
    }
    for (int dtype = 0; dtype < 3; dtype++) {
        const void *src = dtype == 0 ? (const void *)x : dtype == 1 ? (const void *)xh : (const void *)xb;
        for (int threads = 1; threads <= 3; threads += 2) {
            memset(out, 0xCD, F * H * W * C);
            /* CFHW contiguous */
            int rc = h3_pack_frames(src, dtype, 0, n, C, F, H, W, F * H * W, H * W, W, 1, mean, std, C,
                                    out, F * H * W * C, threads);
            CHECK(rc == 0);
            for (int64_t c = 0; c < C; c++)
                for (int64_t i = 0; i < F * H * W; i++) {
                    int64_t e = c * F * H * W + i;
                    float v = dtype == 0 ? x[e] : dtype == 1 ? half_to_float(xh[e]) : bits_f32((uint32_t)xb[e] << 16);
                    if (out[i * C + c] != ref_pixel(v, std[c], mean[c])) { CHECK(!"pack value"); c = C; break; }
                }
        }
    }
    /* negative strides: start at the last element and walk backwards over every axis */
    const float *last = x + n - 1;
    CHECK(h3_pack_frames(last, 0, -(n - 1), 1, C, F, H, W, -F * H * W, -H * W, -W, -1, mean, std, C,
                         out, F * H * W * C, 2) == 0);
    CHECK(out[0] == ref_pixel(x[n - 1], std[0], mean[0]));
    /* refusals */
    CHECK(h3_pack_frames(x, 0, 0, n - 1, C, F, H, W, F * H * W, H * W, W, 1, mean, std, C, out, F * H * W * C, 1) < 0);
    CHECK(h3_pack_frames(x, 0, 0, n, C, F, H, W, F * H * W, H * W, W, 1, mean, std, C, out, F * H * W * C - 1, 1) < 0);
    CHECK(h3_pack_frames(x, 3, 0, n, C, F, H, W, F * H * W, H * W, W, 1, mean, std, C, out, F * H * W * C, 1) < 0);
    CHECK(h3_pack_frames(x, 0, 0, n, C, F, H, W, F * H * W, H * W, W, 1, mean, std, 2, out, F * H * W * C, 1) < 0);
    CHECK(h3_pack_frames(x, 0, 0, n, C, F, H, W, F * H * W, H * W, W, 1, mean, std, C, out, F * H * W * C, 0) < 0);
    CHECK(h3_pack_frames(NULL, 0, 0, n, C, F, H, W, F * H * W, H * W, W, 1, mean, std, C, out, F * H * W * C, 1) < 0);
    CHECK(h3_pack_frames(x, 0, 0, n, C, INT64_MAX / 2, H, W, 1, 1, 1, 1, mean, std, C, out, 1, 1) < 0);
    free(x); free(xh); free(xb); free(out);
}

static uint16_t ref_f32_to_bf16(float f) {
    if (isnan(f)) return 0xffff;
    uint32_t u = f32_bits(f);
    uint32_t lower = u & 0xffff, upper = u >> 16;
    if (lower > 0x8000 || (lower == 0x8000 && (upper & 1))) upper++;
    return (uint16_t)upper;
}

static void test_dequantize(void) {
    const int types[] = {2, 3, 6, 7, 8, 12, 13, 14};
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        int64_t values, bytes;
        CHECK(h3_quant_block_size(types[t], &values, &bytes) == 0);
        const int64_t blocks = 37;
        uint8_t *src = malloc(blocks * bytes);
        for (int64_t i = 0; i < blocks * bytes; i++) src[i] = (uint8_t)rnd();
        float *f32 = malloc(sizeof(float) * blocks * values);
        uint16_t *f16 = malloc(2 * blocks * values), *bf16 = malloc(2 * blocks * values);
        CHECK(h3_dequantize(types[t], src, blocks * bytes, f32, 0, 4 * blocks * values, 1) == 0);
        CHECK(h3_dequantize(types[t], src, blocks * bytes, f16, 1, 2 * blocks * values, 2) == 0);
        CHECK(h3_dequantize(types[t], src, blocks * bytes, bf16, 2, 2 * blocks * values, 3) == 0);
        for (int64_t i = 0; i < blocks * values; i++) {
            float back = half_to_float(f16[i]);
            if (isnan(f32[i])) CHECK(isnan(back));
            else {
                /* the float16 result is the nearest half to f32 (or an infinity past 65520) */
                _Float16 want = (_Float16)f32[i];
                if (f32_bits(back) != f32_bits((float)want)) { CHECK(!"float16 rounding"); break; }
            }
            if (bf16[i] != ref_f32_to_bf16(f32[i])) { CHECK(!"bfloat16 rounding"); break; }
        }
        /* refusals: partial block, wrong output size, unknown type and dtype, bad threads */
        CHECK(h3_dequantize(types[t], src, blocks * bytes - 1, f32, 0, 4 * blocks * values, 1) < 0);
        CHECK(h3_dequantize(types[t], src, blocks * bytes, f32, 0, 4 * blocks * values - 4, 1) < 0);
        CHECK(h3_dequantize(types[t], src, blocks * bytes, f32, 1, 4 * blocks * values, 1) < 0);
        CHECK(h3_dequantize(types[t], src, blocks * bytes, f32, 7, 4 * blocks * values, 1) < 0);
        CHECK(h3_dequantize(types[t], src, blocks * bytes, f32, 0, 4 * blocks * values, 0) < 0);
        CHECK(h3_dequantize(types[t], NULL, blocks * bytes, f32, 0, 4 * blocks * values, 1) < 0);
        CHECK(h3_dequantize(types[t], src, INT64_MAX - (INT64_MAX % bytes), f32, 0, 4, 1) < 0);
        free(src); free(f32); free(f16); free(bf16);
    }
    CHECK(h3_dequantize(10, NULL, 0, NULL, 0, 0, 1) < 0); /* Q2_K is not implemented */
}

static void test_arena(void) {
    CHECK(h3_arena_create(0, 64, 0) == NULL);
    CHECK(h3_arena_create(4096, 48, 0) == NULL);
    CHECK(h3_arena_create(4000, 64, 0) == NULL);
    for (uint64_t align = 16; align <= 4096; align *= 16) {
        const uint64_t cap = 1 << 20;
        h3_arena *a = h3_arena_create(cap, align, align == 4096 ? 65536 : 0);
        CHECK(a != NULL);
        uint8_t *base = h3_arena_base(a);
        enum { SLOTS = 64 };
        uint64_t handle[SLOTS], off[SLOTS], size[SLOTS];
        int live[SLOTS] = {0};
        uint64_t used = 0;
        for (int step = 0; step < 4000; step++) {
            int k = (int)(rnd() % SLOTS);
            if (live[k]) {
                for (uint64_t i = 0; i < size[k]; i++)
                    if (base[off[k] + i] != (uint8_t)k) { CHECK(!"arena bytes clobbered"); break; }
                CHECK(h3_arena_free(a, handle[k]) == 0);
                CHECK(h3_arena_free(a, handle[k]) < 0); /* double free is refused */
                used -= (size[k] + align - 1) / align * align;
                live[k] = 0;
            } else {
                size[k] = 1 + rnd() % 40000;
                int rc = h3_arena_alloc(a, size[k], &handle[k], &off[k]);
                if (rc != 0) { CHECK(rc == -3); continue; }
                CHECK(off[k] % align == 0 && ((uintptr_t)(base + off[k])) % align == 0);
                CHECK(off[k] + size[k] <= cap);
                memset(base + off[k], k, size[k]);
                used += (size[k] + align - 1) / align * align;
                live[k] = 1;
            }
            h3_arena_stats_t s;
            CHECK(h3_arena_stats(a, &s, sizeof s) == 0);
            CHECK(s.used == used && s.used + s.free == cap && s.largest_free <= s.free);
        }
        for (int k = 0; k < SLOTS; k++)
            if (live[k]) CHECK(h3_arena_free(a, handle[k]) == 0);
        h3_arena_stats_t s;
        CHECK(h3_arena_stats(a, &s, sizeof s) == 0);
        CHECK(s.used == 0 && s.free_blocks == 1 && s.largest_free == cap && s.high_water > 0);
        CHECK(h3_arena_stats(a, &s, sizeof s - 8) < 0);
        CHECK(h3_arena_free(a, 0xffffffffffffull) < 0);
        uint64_t h, o;
        CHECK(h3_arena_alloc(a, 0, &h, &o) < 0);
        CHECK(h3_arena_alloc(a, cap + 1, &h, &o) < 0);
        CHECK(h3_arena_alloc(NULL, 16, &h, &o) < 0);
        h3_arena_destroy(a);
    }
    h3_arena_destroy(NULL);
}

int main(void) {
    CHECK(fegetround() == FE_TONEAREST);
    CHECK(h3_abi_version() == 1);
    test_pack();
    test_dequantize();
    test_arena();
    if (failures) { fprintf(stderr, "%d check(s) failed\n", failures); return 1; }
    printf("h3_core C tests passed\n");
    return 0;
}
