/* One decoding step of mt's Transformer (mt/model/transformer.py, `decode_step`) for a few rows, in C with AVX2
 * and FMA (and AVX-512 VNNI for int8 where the CPU has it): the target embedding, the decoder layers and the output layer in one call, fp32 or int8.
 * mt/model/native_step.py compiles it, lays out the weights and calls `mt_step`; it says why this exists. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* The model's sizes (`dims`, as native_step.py fills it) and its parameters (`params`): per decoder layer
 * PER_LAYER slots, then the tail. A linear layer takes three slots: weight, int8 scales (NULL in fp32), bias (or
 * NULL). fp32 weights are (in, out) row-major; int8 ones are packed (in / 4, out rounded up to 8, 4), four inputs
 * of each output side by side, and each output has its scale. */
enum { D_MODEL, HEADS, D_FF, LAYERS, VOCAB, PRE_NORM, ACTIVATION, INT8, N_DIMS };
enum { RELU, GELU, SILU };
enum { QKV = 0, SELF_OUT = 3, CROSS_Q = 6, CROSS_OUT = 9, UP = 12, DOWN = 15, NORM_SELF = 18, NORM_CROSS = 20,
       NORM_FFN = 22, PER_LAYER = 24 };
enum { EMBED = 0, POSITIONS = 1, DEC_NORM = 2, OUTPUT = 4 };

typedef struct {
    const void *weight;
    const float *scale;
    const float *bias;
} Linear;

ALWAYS_INLINE Linear linear_at(void *const *p) {
    return (Linear){p[0], (const float *)p[1], (const float *)p[2]};
}

ALWAYS_INLINE __m256i tail_mask(int n) { /* the first n lanes of 8 (all of them from 8 on) */
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The products stream the weights in the order they lie in memory, `kb` inputs' rows of the weight at a time, each
 * weight read once for all rows and added into y: the step is bound by reading the weights. */
ALWAYS_INLINE void f32_block(const float *x, int rows, int in, int out, const float *w, int i, const int kb,
                             float *y) {
    const float *wi = w + (size_t)i * out;
    for (int o = 0; o < out; o += 8) {
        int whole = out - o >= 8;
        __m256i m = tail_mask(out - o);
        __m256 wv[16];
        for (int k = 0; k < kb; k++) _mm_prefetch((const char *)(wi + (size_t)k * out + o + 128), _MM_HINT_T0);
        for (int k = 0; k < kb; k++)
            wv[k] = whole ? _mm256_loadu_ps(wi + (size_t)k * out + o) : _mm256_maskload_ps(wi + (size_t)k * out + o, m);
        for (int r = 0; r < rows; r++) {
            float *yr = y + (size_t)r * out + o;
            const float *xr = x + (size_t)r * in + i;
            __m256 a = whole ? _mm256_loadu_ps(yr) : _mm256_maskload_ps(yr, m), b = _mm256_setzero_ps();
            for (int k = 0; k + 1 < kb; k += 2) {
                a = _mm256_fmadd_ps(wv[k], _mm256_broadcast_ss(xr + k), a);
                b = _mm256_fmadd_ps(wv[k + 1], _mm256_broadcast_ss(xr + k + 1), b);
            }
            if (kb % 2) a = _mm256_fmadd_ps(wv[kb - 1], _mm256_broadcast_ss(xr + kb - 1), a);
            a = _mm256_add_ps(a, b);
            if (whole) _mm256_storeu_ps(yr, a);
            else _mm256_maskstore_ps(yr, m, a);
        }
    }
}

/* One row: 12 of x's inputs held broadcast in registers for a whole sweep over the outputs, the weights read straight
 * into the multiply-adds: one load per multiply-add, and no prefetching (both measured faster for a lone row). */
ALWAYS_INLINE void f32_row_block(const float *x, int out, const float *w, int i, const int kb, float *y) {
    const float *wi = w + (size_t)i * out;
    __m256 xv[12];
    for (int k = 0; k < kb; k++) xv[k] = _mm256_broadcast_ss(x + i + k);
    int o = 0;
    for (; o + 8 <= out; o += 8) {
        __m256 a = _mm256_loadu_ps(y + o), b = _mm256_setzero_ps();
        for (int k = 0; k + 1 < kb; k += 2) {
            a = _mm256_fmadd_ps(_mm256_loadu_ps(wi + (size_t)k * out + o), xv[k], a);
            b = _mm256_fmadd_ps(_mm256_loadu_ps(wi + (size_t)(k + 1) * out + o), xv[k + 1], b);
        }
        if (kb % 2) a = _mm256_fmadd_ps(_mm256_loadu_ps(wi + (size_t)(kb - 1) * out + o), xv[kb - 1], a);
        _mm256_storeu_ps(y + o, _mm256_add_ps(a, b));
    }
    if (o < out) {
        __m256i m = tail_mask(out - o);
        __m256 a = _mm256_maskload_ps(y + o, m);
        for (int k = 0; k < kb; k++) a = _mm256_fmadd_ps(_mm256_maskload_ps(wi + (size_t)k * out + o, m), xv[k], a);
        _mm256_maskstore_ps(y + o, m, a);
    }
}

/* fp32: y (rows, out) = x (rows, in) @ w (in, out) + bias. */
static void linear_f32(const float *x, int rows, int in, int out, Linear l, float *y) {
    for (int r = 0; r < rows; r++) {
        if (l.bias) memcpy(y + (size_t)r * out, l.bias, sizeof(float) * out);
        else memset(y + (size_t)r * out, 0, sizeof(float) * out);
    }
    int i = 0;
    if (rows == 1) {
        for (; i + 12 <= in; i += 12) f32_row_block(x, out, l.weight, i, 12, y);
        for (; i + 4 <= in; i += 4) f32_row_block(x, out, l.weight, i, 4, y);
        for (; i < in; i++) f32_row_block(x, out, l.weight, i, 1, y);
        return;
    }
    for (; i + 16 <= in; i += 16) f32_block(x, rows, in, out, l.weight, i, 16, y);
    for (; i + 8 <= in; i += 8) f32_block(x, rows, in, out, l.weight, i, 8, y);
    for (; i < in; i++) f32_block(x, rows, in, out, l.weight, i, 1, y);
}

/* int8: each row of x quantized on its own, symmetric, to [-127, 127] (its scale in sx). */
static void quantize_rows(const float *x, int rows, int in, int8_t *q, float *sx) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * in;
        float amax = 0.0f;
        for (int i = 0; i < in; i++) amax = fmaxf(amax, fabsf(xr[i]));
        sx[r] = amax > 0.0f ? amax / 127.0f : 1.0f;
        float inv = 1.0f / sx[r];
        for (int i = 0; i < in; i++) q[(size_t)r * in + i] = (int8_t)lrintf(xr[i] * inv);
    }
}

/* Sums of four int8 products per 32-bit lane. The sign of x moves onto w so that the unsigned-by-signed products
 * multiply |x| by ±w: with AVX2's maddubs, pairs then stay within 2 * 127 * 127, under int16's limit, and nothing
 * saturates; built for AVX-512 VNNI (native_step.py chooses), one vpdpbusd sums the four exactly. The same sums. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
ALWAYS_INLINE __m256i dot4(__m256i acc, __m256i x4, __m256i w) {
    return _mm256_dpbusd_epi32(acc, _mm256_sign_epi8(x4, x4), _mm256_sign_epi8(w, x4));
}
#else
ALWAYS_INLINE __m256i dot4(__m256i acc, __m256i x4, __m256i w) {
    __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(x4, x4), _mm256_sign_epi8(w, x4));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
#endif

/* int32 sums of `kb` groups of four inputs, streamed as in f32_block. */
ALWAYS_INLINE void i8_block(const int8_t *q, int rows, int in, int padded, const int8_t *w, int g, const int kb,
                            int32_t *acc) {
    const int8_t *wg = w + (size_t)g * padded * 4;
    for (int o = 0; o < padded; o += 8) {
        __m256i wv[4];
        for (int k = 0; k < kb; k++) wv[k] = _mm256_loadu_si256((const __m256i *)(wg + ((size_t)k * padded + o) * 4));
        for (int r = 0; r < rows; r++) {
            int32_t *ar = acc + (size_t)r * padded + o;
            __m256i a = _mm256_loadu_si256((const __m256i *)ar);
            for (int k = 0; k < kb; k++) {
                int32_t x4;
                memcpy(&x4, q + (size_t)r * in + 4 * (g + k), 4);
                a = dot4(a, _mm256_set1_epi32(x4), wv[k]);
            }
            _mm256_storeu_si256((__m256i *)ar, a);
        }
    }
}

/* int8: y (rows, out) = the int32 products of quantized x and w, times both scales, + bias. */
static void linear_i8(const float *x, int rows, int in, int out, Linear l, float *y, int8_t *q, float *sx,
                      int32_t *acc) {
    int padded = (out + 7) / 8 * 8, groups = in / 4, g = 0;
    quantize_rows(x, rows, in, q, sx);
    memset(acc, 0, sizeof(int32_t) * rows * padded);
    for (; g + 4 <= groups; g += 4) i8_block(q, rows, in, padded, l.weight, g, 4, acc);
    for (; g < groups; g++) i8_block(q, rows, in, padded, l.weight, g, 1, acc);
    for (int o = 0; o < out; o += 8) {
        __m256i m = tail_mask(out - o);
        __m256 scale = _mm256_maskload_ps(l.scale + o, m);
        __m256 bias = l.bias ? _mm256_maskload_ps(l.bias + o, m) : _mm256_setzero_ps();
        for (int r = 0; r < rows; r++) {
            __m256 sum = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(acc + (size_t)r * padded + o)));
            __m256 v = _mm256_fmadd_ps(sum, _mm256_mul_ps(scale, _mm256_set1_ps(sx[r])), bias);
            _mm256_maskstore_ps(y + (size_t)r * out + o, m, v);
        }
    }
}

typedef struct {
    const int64_t *dims;
    int8_t *q;     /* int8 activations */
    float *sx;     /* their scales */
    int32_t *acc;  /* their products' sums */
} Scratch;

static void linear(const Scratch *m, const float *x, int rows, int in, int out, void *const *slot, float *y) {
    Linear l = linear_at(slot);
    if (m->dims[INT8]) linear_i8(x, rows, in, out, l, y, m->q, m->sx, m->acc);
    else linear_f32(x, rows, in, out, l, y);
}

static void layer_norm(const float *x, int rows, int d, void *const *slot, float eps, float *y) {
    const float *g = slot[0], *b = slot[1];
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * d;
        float *yr = y + (size_t)r * d;
        float mean = 0.0f, var = 0.0f;
        for (int i = 0; i < d; i++) mean += xr[i];
        mean /= d;
        for (int i = 0; i < d; i++) var += (xr[i] - mean) * (xr[i] - mean);
        float inv = 1.0f / sqrtf(var / d + eps);
        for (int i = 0; i < d; i++) yr[i] = (xr[i] - mean) * inv * g[i] + b[i];
    }
}

/* Softmax-weighted sum of `n` values for one query of one head: keys and values `stride` floats apart. */
static void attend(const float *q, const float *k, const float *v, size_t stride, int n, const uint8_t *allowed,
                   int dh, float *scores, float *y) {
    float scale = 1.0f / sqrtf((float)dh), top = -INFINITY;
    for (int j = 0; j < n; j++) {
        float s = -INFINITY;
        if (!allowed || allowed[j]) {
            const float *kj = k + j * stride;
            s = 0.0f;
            for (int e = 0; e < dh; e++) s += q[e] * kj[e];
            s *= scale;
        }
        scores[j] = s;
        top = fmaxf(top, s);
    }
    float total = 0.0f;
    for (int j = 0; j < n; j++) total += scores[j] = expf(scores[j] - top);
    for (int e = 0; e < dh; e++) y[e] = 0.0f;
    for (int j = 0; j < n; j++) {
        const float *vj = v + j * stride;
        float p = scores[j] / total;
        for (int e = 0; e < dh; e++) y[e] += p * vj[e];
    }
}

static void activate(float *x, size_t n, int kind) {
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        if (kind == RELU) x[i] = v > 0.0f ? v : 0.0f;
        else if (kind == GELU) x[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
        else x[i] = v / (1.0f + expf(-v));
    }
}

/* x += y, then x = LayerNorm(x) after a post-norm sublayer. */
static void add_residual(const Scratch *m, float *x, const float *y, int rows, void *const *norm, float eps) {
    int d = m->dims[D_MODEL];
    for (size_t i = 0; i < (size_t)rows * d; i++) x[i] += y[i];
    if (!m->dims[PRE_NORM]) layer_norm(x, rows, d, norm, eps, x);
}

/* The step for `rows` rows at position t: `beam` rows per sentence, n_src source positions. `caches` holds per
 * layer the self-attention keys and values, (max steps, rows, H, Dh), and the encoder memory's keys and values,
 * (sentences, H, n_src, Dh); `src_mask` (sentences, n_src) is 1 where a source position is not padding. Writes
 * this step's keys and values into the caches and the logits, (rows, vocab), into `logits`. Returns 0; -1 when out
 * of memory, -2 for a token outside the vocabulary (nothing written then). */
int mt_step(const int64_t *dims, const float *eps_scale, void *const *params, int rows, int t, int beam, int n_src,
            const int64_t *tokens, void *const *caches, const uint8_t *src_mask, float *logits) {
    int d = dims[D_MODEL], h = dims[HEADS], dh = d / h, ff = dims[D_FF], n_layers = dims[LAYERS];
    float eps = eps_scale[0], embed_scale = eps_scale[1];
    size_t widest = (size_t)(3 * d > ff ? 3 * d : ff);
    int longest = t + 1 > n_src ? t + 1 : n_src;
    float *x = malloc(sizeof(float) * ((size_t)rows * (d + d + widest + d) + longest));
    size_t outputs = widest > (size_t)dims[VOCAB] ? widest : (size_t)dims[VOCAB], int8 = dims[INT8] != 0;
    int8_t *q = int8 ? malloc((size_t)rows * (ff > d ? ff : d)) : NULL; /* int8's scratch, only there */
    float *sx = int8 ? malloc(sizeof(float) * rows) : NULL;
    int32_t *acc = int8 ? malloc(sizeof(int32_t) * rows * (outputs + 8)) : NULL;
    if (!x || (int8 && (!q || !sx || !acc))) {
        free(x); free(q); free(sx); free(acc);
        return -1;
    }
    for (int r = 0; r < rows; r++)
        if (tokens[r] < 0 || tokens[r] >= dims[VOCAB]) {
            free(x); free(q); free(sx); free(acc);
            return -2;
        }
    float *normed = x + (size_t)rows * d, *wide = normed + (size_t)rows * d, *mixed = wide + (size_t)rows * widest;
    float *scores = mixed + (size_t)rows * d;
    Scratch m = {dims, q, sx, acc};
    void *const *tail = params + (size_t)n_layers * PER_LAYER;
    const float *embed = tail[EMBED], *position = (const float *)tail[POSITIONS] + (size_t)t * d;

    for (int r = 0; r < rows; r++)
        for (int i = 0; i < d; i++) x[(size_t)r * d + i] = embed[tokens[r] * d + i] * embed_scale + position[i];

    for (int layer = 0; layer < n_layers; layer++) {
        void *const *p = params + (size_t)layer * PER_LAYER;
        float *self_k = caches[4 * layer], *self_v = caches[4 * layer + 1];
        const float *mem_k = caches[4 * layer + 2], *mem_v = caches[4 * layer + 3];
        const float *in = x;

        if (dims[PRE_NORM]) layer_norm(x, rows, d, p + NORM_SELF, eps, normed), in = normed;
        linear(&m, in, rows, d, 3 * d, p + QKV, wide); /* (rows, 3, H, Dh) */
        float *k_at = self_k + (size_t)t * rows * d, *v_at = self_v + (size_t)t * rows * d;
        for (int r = 0; r < rows; r++) {
            memcpy(k_at + (size_t)r * d, wide + (size_t)r * 3 * d + d, sizeof(float) * d);
            memcpy(v_at + (size_t)r * d, wide + (size_t)r * 3 * d + 2 * d, sizeof(float) * d);
        }
        for (int r = 0; r < rows; r++)
            for (int head = 0; head < h; head++) {
                size_t at = (size_t)r * d + (size_t)head * dh;
                attend(wide + (size_t)r * 3 * d + (size_t)head * dh, self_k + at, self_v + at, (size_t)rows * d, t + 1,
                       NULL, dh, scores, mixed + at);
            }
        linear(&m, mixed, rows, d, d, p + SELF_OUT, wide);
        add_residual(&m, x, wide, rows, p + NORM_SELF, eps);

        in = x;
        if (dims[PRE_NORM]) layer_norm(x, rows, d, p + NORM_CROSS, eps, normed), in = normed;
        linear(&m, in, rows, d, d, p + CROSS_Q, wide);
        for (int r = 0; r < rows; r++) {
            int s = r / beam;
            for (int head = 0; head < h; head++) {
                size_t at = ((size_t)s * h + head) * n_src * dh;
                attend(wide + (size_t)r * d + (size_t)head * dh, mem_k + at, mem_v + at, dh, n_src,
                       src_mask + (size_t)s * n_src, dh, scores, mixed + (size_t)r * d + (size_t)head * dh);
            }
        }
        linear(&m, mixed, rows, d, d, p + CROSS_OUT, wide);
        add_residual(&m, x, wide, rows, p + NORM_CROSS, eps);

        in = x;
        if (dims[PRE_NORM]) layer_norm(x, rows, d, p + NORM_FFN, eps, normed), in = normed;
        linear(&m, in, rows, d, ff, p + UP, wide);
        activate(wide, (size_t)rows * ff, dims[ACTIVATION]);
        linear(&m, wide, rows, ff, d, p + DOWN, mixed);
        add_residual(&m, x, mixed, rows, p + NORM_FFN, eps);
    }
    const float *last = x;
    if (dims[PRE_NORM]) layer_norm(x, rows, d, tail + DEC_NORM, eps, normed), last = normed;
    linear(&m, last, rows, d, dims[VOCAB], tail + OUTPUT, logits);
    free(x); free(q); free(sx); free(acc);
    return 0;
}
