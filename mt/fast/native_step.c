/* One decoding step of mt's Transformer (mt/model/transformer.py, `decode_step`) for a few rows, in C with AVX2
 * and FMA (and AVX-512 VNNI for int8 where the CPU has it): the target embedding, the decoder layers and the output
 * layer in one call, fp32 or int8.
 * mt/fast/native_step.py compiles it, lays out the weights and calls `mt_step`; it says why this exists. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* The model's sizes (`dims`, as native_layout.py fills it) and its weights (`params`), named below. */
enum { D_MODEL, HEADS, D_FF, LAYERS, VOCAB, PRE_NORM, ACTIVATION, INT8, N_DIMS };
enum { RELU, GELU, SILU };

/* The weights the step and the encoder read, by their names in the model (mt/model/transformer.py): per layer of
 * the stack, then the rest. `params` holds them in this order, SLOTS pointers each: a linear layer's weight, int8
 * scales and int8 column sums (NULL in fp32), and bias (or NULL); a norm's weight and bias in the first and the last;
 * a table in the first. native_layout.py lays them out by these names (`mt_weight_names`), so the two cannot
 * disagree on an order. Weights are packed in panels of outputs, each panel's weights in one run: fp32 ones in
 * panels of 16, (out rounded up to 16 / 16, in, 16); int8 ones in panels of PANEL (8 with AVX2, 16 with AVX-512),
 * (out rounded up / PANEL, in / 4, PANEL, 4), four inputs of each output side by side; each int8 output has its
 * scale and the sum of its weights. */
#define DECODER_LAYER(X) X(QKV, "self_attn.qkv") X(SELF_OUT, "self_attn.out") X(CROSS_Q, "cross_attn.q") \
    X(CROSS_OUT, "cross_attn.out") X(UP, "ffn.up") X(DOWN, "ffn.down") X(NORM_SELF, "res_self.norm") \
    X(NORM_CROSS, "res_cross.norm") X(NORM_FFN, "res_ffn.norm")
#define DECODER_REST(X) X(EMBED, "tgt_embed") X(POSITIONS, "positions") X(DEC_NORM, "dec_norm") X(OUTPUT, "output")
#define ENCODER_LAYER(X) X(E_QKV, "self_attn.qkv") X(E_OUT, "self_attn.out") X(E_UP, "ffn.up") \
    X(E_DOWN, "ffn.down") X(E_NORM_ATTN, "res_attn.norm") X(E_NORM_FFN, "res_ffn.norm")
#define ENCODER_REST(X) X(SRC_EMBED, "src_embed") X(SRC_POSITIONS, "positions") X(ENC_NORM, "enc_norm")
#define ENTRY(e, name) e,
#define NAME(e, name) name " "
enum { DECODER_LAYER(ENTRY) PER_LAYER };
enum { DECODER_REST(ENTRY) };
enum { ENCODER_LAYER(ENTRY) ENC_PER_LAYER };
enum { ENCODER_REST(ENTRY) };
#define SLOTS 4
#define AT(p, e) ((p) + SLOTS * (size_t)(e))

/* The names of one part's weights, space-separated: 0 a decoder layer's, 1 the decoder's others, 2 an encoder
 * layer's, 3 the encoder's others. */
const char *mt_weight_names(int part) {
    static const char *names[] = {DECODER_LAYER(NAME), DECODER_REST(NAME), ENCODER_LAYER(NAME), ENCODER_REST(NAME)};
    return part >= 0 && part < 4 ? names[part] : NULL;
}

int mt_weight_slots(void) { return SLOTS; }

typedef struct {
    const void *weight;
    const float *scale;
    const int32_t *sums;
    const float *bias;
} Linear;

ALWAYS_INLINE Linear linear_at(void *const *p) {
    return (Linear){p[0], (const float *)p[1], (const int32_t *)p[2], (const float *)p[3]};
}

ALWAYS_INLINE __m256i tail_mask(int n) { /* the first n lanes of 8 (all of them from 8 on) */
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The first n of 8 floats at p (n >= 8: all of them), loaded and stored; masked only for a tail, since a masked
 * store costs many cycles on AMD's CPUs. */
ALWAYS_INLINE __m256 load_upto(const float *p, int n) {
    return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, tail_mask(n));
}

ALWAYS_INLINE void store_upto(float *p, int n, __m256 v) {
    if (n >= 8) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, tail_mask(n), v);
}

/* fp32: R rows' sums for one panel of 16 outputs (its weights, (in, 16), lie in one run), kept in registers over
 * all inputs, each weight read once for all R rows; added into y. A lone row sums odd and even inputs apart, so that
 * four chains of multiply-adds run side by side. */
ALWAYS_INLINE void f32_panel(const float *x, int in, const float *w, const int R, float *y, int out, int o) {
    __m256 a[4][2], b[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int r = 0; r < R; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
    int i = 0;
    if (R == 1)
        for (; i + 2 <= in; i += 2) {
            __m256 x0 = _mm256_broadcast_ss(x + i), x1 = _mm256_broadcast_ss(x + i + 1);
            a[0][0] = _mm256_fmadd_ps(_mm256_loadu_ps(w + (size_t)i * 16), x0, a[0][0]);
            a[0][1] = _mm256_fmadd_ps(_mm256_loadu_ps(w + (size_t)i * 16 + 8), x0, a[0][1]);
            b[0] = _mm256_fmadd_ps(_mm256_loadu_ps(w + (size_t)i * 16 + 16), x1, b[0]);
            b[1] = _mm256_fmadd_ps(_mm256_loadu_ps(w + (size_t)i * 16 + 24), x1, b[1]);
        }
    for (; i < in; i++) {
        __m256 w0 = _mm256_loadu_ps(w + (size_t)i * 16), w1 = _mm256_loadu_ps(w + (size_t)i * 16 + 8);
        for (int r = 0; r < R; r++) {
            __m256 xb = _mm256_broadcast_ss(x + (size_t)r * in + i);
            a[r][0] = _mm256_fmadd_ps(w0, xb, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(w1, xb, a[r][1]);
        }
    }
    a[0][0] = _mm256_add_ps(a[0][0], b[0]), a[0][1] = _mm256_add_ps(a[0][1], b[1]);
    for (int r = 0; r < R; r++) {
        float *yr = y + (size_t)r * out + o;
        for (int k = 0; k < 2 && o + 8 * k < out; k++) { /* the last panel may hold fewer than 16 outputs */
            int left = out - o - 8 * k;
            store_upto(yr + 8 * k, left, _mm256_add_ps(load_upto(yr + 8 * k, left), a[r][k]));
        }
    }
}

#ifdef __AVX512F__
/* The same with AVX-512 (the library built for VNNI): a panel's 16 outputs in one register per row, P panels side
 * by side so that enough multiply-adds run at once. */
ALWAYS_INLINE void f32_panels512(const float *x, int in, const float *w, const int R, const int P, float *y, int out,
                                 int o) {
    __m512 a[4][2], b[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int r = 0; r < R; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
    int i = 0;
    if (R == 1)
        for (; i + 2 <= in; i += 2) {
            __m512 x0 = _mm512_set1_ps(x[i]), x1 = _mm512_set1_ps(x[i + 1]);
            for (int k = 0; k < P; k++) {
                a[0][k] = _mm512_fmadd_ps(_mm512_loadu_ps(w + ((size_t)k * in + i) * 16), x0, a[0][k]);
                b[k] = _mm512_fmadd_ps(_mm512_loadu_ps(w + ((size_t)k * in + i + 1) * 16), x1, b[k]);
            }
        }
    for (; i < in; i++) {
        __m512 wv[2];
        for (int k = 0; k < P; k++) wv[k] = _mm512_loadu_ps(w + ((size_t)k * in + i) * 16);
        for (int r = 0; r < R; r++) {
            __m512 xb = _mm512_set1_ps(x[(size_t)r * in + i]);
            for (int k = 0; k < P; k++) a[r][k] = _mm512_fmadd_ps(wv[k], xb, a[r][k]);
        }
    }
    for (int k = 0; k < P; k++) a[0][k] = _mm512_add_ps(a[0][k], b[k]);
    for (int r = 0; r < R; r++)
        for (int k = 0; k < P && o + 16 * k < out; k++) { /* the last panel may hold fewer than 16 outputs */
            int left = out - o - 16 * k;
            __mmask16 m = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
            float *yr = y + (size_t)r * out + o + 16 * k;
            _mm512_mask_storeu_ps(yr, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, yr), a[r][k]));
        }
}

/* `blocks` blocks of R rows side by side, each group of panels for every block in turn: its weights stay in the
 * nearest cache while they pass. */
ALWAYS_INLINE void f32_rows(const float *x, int in, int out, const float *w, const int R, int blocks, float *y) {
    int o = 0;
    for (; o + 16 < out; o += 32)
        for (int b = 0; b < blocks; b++)
            f32_panels512(x + (size_t)b * R * in, in, w + (size_t)o * in, R, 2, y + (size_t)b * R * out, out, o);
    if (o < out)
        for (int b = 0; b < blocks; b++)
            f32_panels512(x + (size_t)b * R * in, in, w + (size_t)o * in, R, 1, y + (size_t)b * R * out, out, o);
}
#else
ALWAYS_INLINE void f32_rows(const float *x, int in, int out, const float *w, const int R, int blocks, float *y) {
    for (int o = 0; o < out; o += 16)
        for (int b = 0; b < blocks; b++)
            f32_panel(x + (size_t)b * R * in, in, w + (size_t)o * in, R, y + (size_t)b * R * out, out, o);
}
#endif

/* fp32: y (rows, out) = x (rows, in) @ w + bias, four rows at a time. */
static void linear_f32(const float *x, int rows, int in, int out, Linear l, float *y) {
    for (int r = 0; r < rows; r++) {
        if (l.bias) memcpy(y + (size_t)r * out, l.bias, sizeof(float) * out);
        else memset(y + (size_t)r * out, 0, sizeof(float) * out);
    }
    int full = rows / 4 * 4;
    if (full) f32_rows(x, in, out, l.weight, 4, full / 4, y);
    const float *xr = x + (size_t)full * in;
    float *yr = y + (size_t)full * out;
    switch (rows - full) {
    case 1: f32_rows(xr, in, out, l.weight, 1, 1, yr); break;
    case 2: f32_rows(xr, in, out, l.weight, 2, 1, yr); break;
    case 3: f32_rows(xr, in, out, l.weight, 3, 1, yr); break;
    }
}

/* int8: activations unsigned, each row quantized on its own over [min(x, 0), max(x, 0)] with a zero point (its
 * scale in sx, its zero point in zx), to 256 levels where vpdpbusd sums four products of unsigned by signed bytes
 * exactly (AVX-512 VNNI), to 128 where AVX2's vpmaddubsw sums pairs of them in int16: 2 * 127 * 127 stays under
 * its limit, so nothing saturates (PyTorch's fbgemm likewise keeps activations to 7 bits on x86). */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LEVELS 255
#define PANEL 16 /* int8 outputs per register: the packed weights' panels (mt_int8_panel tells native_step.py) */
typedef __m512i Sums;
ALWAYS_INLINE Sums sums_zero(void) { return _mm512_setzero_si512(); }
ALWAYS_INLINE Sums sums_load(const int8_t *p) { return _mm512_loadu_si512(p); }
ALWAYS_INLINE Sums sums_set1(int32_t v) { return _mm512_set1_epi32(v); }
ALWAYS_INLINE void sums_store(int32_t *p, Sums v) { _mm512_storeu_si512(p, v); }
ALWAYS_INLINE Sums dot4(Sums acc, Sums x4, Sums w) { return _mm512_dpbusd_epi32(acc, x4, w); }
#else
#define LEVELS 127
#define PANEL 8
typedef __m256i Sums;
ALWAYS_INLINE Sums sums_zero(void) { return _mm256_setzero_si256(); }
ALWAYS_INLINE Sums sums_load(const int8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
ALWAYS_INLINE Sums sums_set1(int32_t v) { return _mm256_set1_epi32(v); }
ALWAYS_INLINE void sums_store(int32_t *p, Sums v) { _mm256_storeu_si256((__m256i *)p, v); }
ALWAYS_INLINE Sums dot4(Sums acc, Sums x4, Sums w) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(x4, w), _mm256_set1_epi16(1)));
}
#endif

int mt_int8_panel(void) { return PANEL; }

static void quantize_rows(const float *x, int rows, int in, uint8_t *q, float *sx, int32_t *zx) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * in;
        __m256 low = _mm256_setzero_ps(), high = _mm256_setzero_ps();
        int i = 0;
        for (; i + 8 <= in; i += 8) {
            __m256 v = _mm256_loadu_ps(xr + i);
            low = _mm256_min_ps(low, v), high = _mm256_max_ps(high, v);
        }
        float lows[8], highs[8], lo = 0.0f, hi = 0.0f;
        _mm256_storeu_ps(lows, low), _mm256_storeu_ps(highs, high);
        for (int k = 0; k < 8; k++) lo = lows[k] < lo ? lows[k] : lo, hi = highs[k] > hi ? highs[k] : hi;
        for (; i < in; i++) lo = xr[i] < lo ? xr[i] : lo, hi = xr[i] > hi ? xr[i] : hi; /* not fminf: a libm call */
        sx[r] = hi > lo ? (hi - lo) / (float)LEVELS : 1.0f;
        zx[r] = (int32_t)lrintf(-lo / sx[r]);
        float inv = 1.0f / sx[r];
        uint8_t *qr = q + (size_t)r * in;
        __m256 scale = _mm256_set1_ps(inv);
        __m256i zero = _mm256_set1_epi32(zx[r]), top = _mm256_set1_epi32(LEVELS), none = _mm256_setzero_si256();
        __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* the packs work within 128-bit lanes */
        for (i = 0; i + 32 <= in; i += 32) { /* rounded to nearest even, as lrintf */
            __m256i v[4];
            for (int k = 0; k < 4; k++)
                v[k] = _mm256_min_epi32(_mm256_max_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(
                    _mm256_mul_ps(_mm256_loadu_ps(xr + i + 8 * k), scale)), zero), none), top);
            __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            _mm256_storeu_si256((__m256i *)(qr + i), _mm256_permutevar8x32_epi32(bytes, order));
        }
        for (; i < in; i++) {
            long v = lrintf(xr[i] * inv) + zx[r];
            qr[i] = (uint8_t)(v < 0 ? 0 : v > LEVELS ? LEVELS : v);
        }
    }
}

/* int32 sums over all of x's inputs for R rows and P panels of PANEL outputs (each panel's weights lie in one run,
 * group after group): the R * P sums stay in registers throughout and each weight is read once for all R rows. */
ALWAYS_INLINE void i8_panels(const uint8_t *q, int in, int groups, const int8_t *w, int panel, const int R,
                             const int P, int32_t *acc, int padded) {
    Sums a[4][4];
    for (int r = 0; r < R; r++)
        for (int k = 0; k < P; k++) a[r][k] = sums_zero();
    const int8_t *wp = w + (size_t)panel * groups * PANEL * 4;
    for (int g = 0; g < groups; g++) {
        Sums wv[4];
        for (int k = 0; k < P; k++) wv[k] = sums_load(wp + ((size_t)k * groups + g) * PANEL * 4);
        for (int r = 0; r < R; r++) {
            int32_t x4;
            memcpy(&x4, q + (size_t)r * in + 4 * g, 4);
            Sums xb = sums_set1(x4);
            for (int k = 0; k < P; k++) a[r][k] = dot4(a[r][k], xb, wv[k]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int k = 0; k < P; k++) sums_store(acc + (size_t)r * padded + (size_t)(panel + k) * PANEL, a[r][k]);
}

/* All panels for `blocks` blocks of R rows side by side: P panels at a time, as many as the registers hold beside
 * R rows' sums, each group of panels for every block in turn (its weights stay in the nearest cache meanwhile). */
ALWAYS_INLINE void i8_rows(const uint8_t *q, int in, const int8_t *w, const int R, int blocks, int32_t *acc,
                           int padded) {
    const int P = R == 1 ? 4 : R == 2 ? 3 : 2;
    int panels = padded / PANEL, groups = in / 4, p = 0;
    for (; p + P <= panels; p += P)
        for (int b = 0; b < blocks; b++)
            i8_panels(q + (size_t)b * R * in, in, groups, w, p, R, P, acc + (size_t)b * R * padded, padded);
    for (; p < panels; p++)
        for (int b = 0; b < blocks; b++)
            i8_panels(q + (size_t)b * R * in, in, groups, w, p, R, 1, acc + (size_t)b * R * padded, padded);
}

/* int8: y (rows, out) = the int32 products of quantized x and w less the zero point's share, times both scales,
 * + bias. */
static void linear_i8(const float *x, int rows, int in, int out, Linear l, float *y, uint8_t *q, float *sx,
                      int32_t *zx, int32_t *acc) {
    int padded = (out + PANEL - 1) / PANEL * PANEL;
    quantize_rows(x, rows, in, q, sx, zx);
    int full = rows / 4 * 4;
    if (full) i8_rows(q, in, l.weight, 4, full / 4, acc, padded);
    const uint8_t *qr = q + (size_t)full * in;
    int32_t *ar = acc + (size_t)full * padded;
    switch (rows - full) {
    case 1: i8_rows(qr, in, l.weight, 1, 1, ar, padded); break;
    case 2: i8_rows(qr, in, l.weight, 2, 1, ar, padded); break;
    case 3: i8_rows(qr, in, l.weight, 3, 1, ar, padded); break;
    }
    for (int o = 0; o < out; o += 8) {
        __m256 scale = load_upto(l.scale + o, out - o);
        __m256 bias = l.bias ? load_upto(l.bias + o, out - o) : _mm256_setzero_ps();
        __m256i sums = _mm256_loadu_si256((const __m256i *)(l.sums + o));
        for (int r = 0; r < rows; r++) {
            __m256i exact = _mm256_sub_epi32(_mm256_loadu_si256((const __m256i *)(acc + (size_t)r * padded + o)),
                                             _mm256_mullo_epi32(sums, _mm256_set1_epi32(zx[r])));
            __m256 sum = _mm256_cvtepi32_ps(exact);
            __m256 v = _mm256_fmadd_ps(sum, _mm256_mul_ps(scale, _mm256_set1_ps(sx[r])), bias);
            store_upto(y + (size_t)r * out + o, out - o, v);
        }
    }
}

typedef struct {
    const int64_t *dims;
    float *f;      /* the floats of the rows in flight */
    uint8_t *q;    /* int8 activations */
    float *sx;     /* their scales */
    int32_t *zx;   /* their zero points */
    int32_t *acc;  /* their products' sums */
} Scratch;

/* Working memory for `rows` rows: `floats` floats, and int8's scratch (only there) for products of up to `outputs`
 * outputs. Returns 0, or -1 when out of memory; scratch_free frees it either way. */
static int scratch_make(Scratch *m, const int64_t *dims, int rows, size_t floats, size_t outputs) {
    size_t widest_in = (size_t)(dims[D_FF] > dims[D_MODEL] ? dims[D_FF] : dims[D_MODEL]);
    *m = (Scratch){dims, malloc(sizeof(float) * floats), NULL, NULL, NULL, NULL};
    if (dims[INT8]) {
        m->q = malloc((size_t)rows * widest_in), m->sx = malloc(sizeof(float) * rows);
        m->zx = malloc(sizeof(int32_t) * rows), m->acc = malloc(sizeof(int32_t) * rows * (outputs + PANEL));
    }
    return m->f && (!dims[INT8] || (m->q && m->sx && m->zx && m->acc)) ? 0 : -1;
}

static void scratch_free(Scratch *m) {
    free(m->f); free(m->q); free(m->sx); free(m->zx); free(m->acc);
}

/* 0, or -2 for a token outside the vocabulary. */
static int known_tokens(const int64_t *tokens, int n, int64_t vocab) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab) return -2;
    return 0;
}

static void linear(const Scratch *m, const float *x, int rows, int in, int out, void *const *slot, float *y) {
    Linear l = linear_at(slot);
    if (m->dims[INT8]) linear_i8(x, rows, in, out, l, y, m->q, m->sx, m->zx, m->acc);
    else linear_f32(x, rows, in, out, l, y);
}

/* The sum of a[i] * b[i] (b NULL: of a[i]) over n, in eight lanes: a plain loop's one running sum is a chain of
 * dependent additions the compiler may not reorder. */
static float sum_of(const float *a, const float *b, int n) {
    __m256 lanes = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(a + i);
        lanes = b ? _mm256_fmadd_ps(x, _mm256_loadu_ps(b + i), lanes) : _mm256_add_ps(lanes, x);
    }
    __m128 half = _mm_add_ps(_mm256_castps256_ps128(lanes), _mm256_extractf128_ps(lanes, 1));
    half = _mm_add_ps(half, _mm_movehl_ps(half, half));
    float total = _mm_cvtss_f32(_mm_add_ss(half, _mm_movehdup_ps(half)));
    for (; i < n; i++) total += b ? a[i] * b[i] : a[i];
    return total;
}

static void layer_norm(const float *x, int rows, int d, void *const *slot, float eps, float *y) {
    const float *g = slot[0], *b = slot[SLOTS - 1];
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * d;
        float *yr = y + (size_t)r * d;
        float mean = sum_of(xr, NULL, d) / d;
        for (int i = 0; i < d; i++) yr[i] = xr[i] - mean;
        float inv = 1.0f / sqrtf(sum_of(yr, yr, d) / d + eps);
        for (int i = 0; i < d; i++) yr[i] = yr[i] * inv * g[i] + b[i];
    }
}

/* Softmax-weighted sum of `n` values for one query of one head: keys and values `stride` floats apart. */
static void attend(const float *q, const float *k, const float *v, size_t stride, int n, const uint8_t *allowed,
                   int dh, float *scores, float *y) {
    float scale = 1.0f / sqrtf((float)dh), top = -INFINITY;
    for (int j = 0; j < n; j++) {
        float s = -INFINITY;
        if (!allowed || allowed[j]) {
            s = sum_of(q, k + j * stride, dh) * scale;
        }
        scores[j] = s;
        top = s > top ? s : top;
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

/* x += the feed-forward sublayer of x, its norm (`norm`) before (pre-norm) or after; `normed`, `wide` and `mixed`
 * are scratch for rows of d, d_ff and d floats. */
static void feed_forward(const Scratch *m, float *x, int rows, void *const *up, void *const *down,
                         void *const *norm, float eps, float *normed, float *wide, float *mixed) {
    int d = m->dims[D_MODEL], ff = m->dims[D_FF];
    const float *in = x;
    if (m->dims[PRE_NORM]) layer_norm(x, rows, d, norm, eps, normed), in = normed;
    linear(m, in, rows, d, ff, up, wide);
    activate(wide, (size_t)rows * ff, m->dims[ACTIVATION]);
    linear(m, wide, rows, ff, d, down, mixed);
    add_residual(m, x, mixed, rows, norm, eps);
}

/* The step for `rows` rows at position t: `beam` rows per sentence, n_src source positions. `caches` holds per
 * layer the self-attention keys and values, (max steps, width, H, Dh) with this call's rows the first `rows` of
 * each position's `width` (a shard of mt_step's), and the encoder memory's keys and values,
 * (sentences, H, n_src, Dh); `src_mask` (sentences, n_src) is 1 where a source position is not padding. Writes
 * this step's keys and values into the caches and the logits, (rows, vocab), into `logits`. Returns 0, or -1 when
 * out of memory (mt_step has checked the tokens). */
static int step_rows(const int64_t *dims, const float *eps_scale, void *const *params, int rows, int width, int t,
                     int beam, int n_src, const int64_t *tokens, void *const *caches, const uint8_t *src_mask,
                     float *logits) {
    int d = dims[D_MODEL], h = dims[HEADS], dh = d / h, ff = dims[D_FF], n_layers = dims[LAYERS];
    float eps = eps_scale[0], embed_scale = eps_scale[1];
    size_t widest = (size_t)(3 * d > ff ? 3 * d : ff);
    int longest = t + 1 > n_src ? t + 1 : n_src;
    size_t outputs = widest > (size_t)dims[VOCAB] ? widest : (size_t)dims[VOCAB];
    Scratch m;
    int status = scratch_make(&m, dims, rows, (size_t)rows * (d + d + widest + d) + longest, outputs);
    if (status != 0) goto done;
    float *x = m.f, *normed = x + (size_t)rows * d, *wide = normed + (size_t)rows * d;
    float *mixed = wide + (size_t)rows * widest, *scores = mixed + (size_t)rows * d;
    void *const *tail = AT(params, (size_t)n_layers * PER_LAYER);
    const float *embed = AT(tail, EMBED)[0], *position = (const float *)AT(tail, POSITIONS)[0] + (size_t)t * d;

    for (int r = 0; r < rows; r++)
        for (int i = 0; i < d; i++) x[(size_t)r * d + i] = embed[tokens[r] * d + i] * embed_scale + position[i];

    for (int layer = 0; layer < n_layers; layer++) {
        void *const *p = AT(params, (size_t)layer * PER_LAYER);
        float *self_k = caches[4 * layer], *self_v = caches[4 * layer + 1];
        const float *mem_k = caches[4 * layer + 2], *mem_v = caches[4 * layer + 3];
        const float *in = x;

        if (dims[PRE_NORM]) layer_norm(x, rows, d, AT(p, NORM_SELF), eps, normed), in = normed;
        linear(&m, in, rows, d, 3 * d, AT(p, QKV), wide); /* (rows, 3, H, Dh) */
        float *k_at = self_k + (size_t)t * width * d, *v_at = self_v + (size_t)t * width * d;
        for (int r = 0; r < rows; r++) {
            memcpy(k_at + (size_t)r * d, wide + (size_t)r * 3 * d + d, sizeof(float) * d);
            memcpy(v_at + (size_t)r * d, wide + (size_t)r * 3 * d + 2 * d, sizeof(float) * d);
        }
        for (int r = 0; r < rows; r++)
            for (int head = 0; head < h; head++) {
                size_t at = (size_t)r * d + (size_t)head * dh;
                attend(wide + (size_t)r * 3 * d + (size_t)head * dh, self_k + at, self_v + at, (size_t)width * d, t + 1,
                       NULL, dh, scores, mixed + at);
            }
        linear(&m, mixed, rows, d, d, AT(p, SELF_OUT), wide);
        add_residual(&m, x, wide, rows, AT(p, NORM_SELF), eps);

        in = x;
        if (dims[PRE_NORM]) layer_norm(x, rows, d, AT(p, NORM_CROSS), eps, normed), in = normed;
        linear(&m, in, rows, d, d, AT(p, CROSS_Q), wide);
        for (int r = 0; r < rows; r++) {
            int s = r / beam;
            for (int head = 0; head < h; head++) {
                size_t at = ((size_t)s * h + head) * n_src * dh;
                attend(wide + (size_t)r * d + (size_t)head * dh, mem_k + at, mem_v + at, dh, n_src,
                       src_mask + (size_t)s * n_src, dh, scores, mixed + (size_t)r * d + (size_t)head * dh);
            }
        }
        linear(&m, mixed, rows, d, d, AT(p, CROSS_OUT), wide);
        add_residual(&m, x, wide, rows, AT(p, NORM_CROSS), eps);

        feed_forward(&m, x, rows, AT(p, UP), AT(p, DOWN), AT(p, NORM_FFN), eps, normed, wide, mixed);
    }
    const float *last = x;
    if (dims[PRE_NORM]) layer_norm(x, rows, d, AT(tail, DEC_NORM), eps, normed), last = normed;
    linear(&m, last, rows, d, dims[VOCAB], AT(tail, OUTPUT), logits);
done:
    scratch_free(&m);
    return status;
}

/* `Transformer.encode` for n sentences of s positions: `tokens` (n, s), `src_mask` (n, s) 1 where a position is not
 * padding; `dims` as the step's, with the encoder's layers and the source vocabulary. Writes the encoder's output,
 * (n, s, d), into `memory`. Returns 0, or -1 when out of memory (mt_encode has checked the tokens). */
static int encode_rows(const int64_t *dims, const float *eps_scale, void *const *params, int n, int s,
                       const int64_t *tokens, const uint8_t *src_mask, float *memory) {
    int d = dims[D_MODEL], h = dims[HEADS], dh = d / h, ff = dims[D_FF], n_layers = dims[LAYERS], rows = n * s;
    float eps = eps_scale[0], embed_scale = eps_scale[1];
    size_t widest = (size_t)(3 * d > ff ? 3 * d : ff);
    Scratch m;
    int status = scratch_make(&m, dims, rows, (size_t)rows * (d + widest + d) + s, widest);
    if (status != 0) goto done;
    float *x = memory, *normed = m.f, *wide = normed + (size_t)rows * d, *mixed = wide + (size_t)rows * widest;
    float *scores = mixed + (size_t)rows * d;
    void *const *tail = AT(params, (size_t)n_layers * ENC_PER_LAYER);
    const float *embed = AT(tail, SRC_EMBED)[0], *positions = AT(tail, SRC_POSITIONS)[0];

    for (int r = 0; r < rows; r++)
        for (int i = 0; i < d; i++)
            x[(size_t)r * d + i] = embed[tokens[r] * d + i] * embed_scale + positions[(size_t)(r % s) * d + i];

    for (int layer = 0; layer < n_layers; layer++) {
        void *const *p = AT(params, (size_t)layer * ENC_PER_LAYER);
        const float *in = x;
        if (dims[PRE_NORM]) layer_norm(x, rows, d, AT(p, E_NORM_ATTN), eps, normed), in = normed;
        linear(&m, in, rows, d, 3 * d, AT(p, E_QKV), wide); /* (rows, 3, H, Dh) */
        for (int r = 0; r < rows; r++) {
            const float *first = wide + (size_t)(r - r % s) * 3 * d; /* the sentence's first position */
            for (int head = 0; head < h; head++) {
                size_t at = (size_t)head * dh;
                attend(wide + (size_t)r * 3 * d + at, first + d + at, first + 2 * d + at, (size_t)3 * d, s,
                       src_mask + (size_t)(r / s) * s, dh, scores, mixed + (size_t)r * d + at);
            }
        }
        linear(&m, mixed, rows, d, d, AT(p, E_OUT), wide);
        add_residual(&m, x, wide, rows, AT(p, E_NORM_ATTN), eps);

        feed_forward(&m, x, rows, AT(p, E_UP), AT(p, E_DOWN), AT(p, E_NORM_FFN), eps, normed, wide, mixed);
    }
    if (dims[PRE_NORM]) layer_norm(x, rows, d, AT(tail, ENC_NORM), eps, x);
done:
    scratch_free(&m);
    return status;
}

/* The step for `rows` rows in shards of whole sentences, one per thread (`threads`, on OpenMP's threads: PyTorch's
 * own where the library shares its OpenMP, so no more threads run than PyTorch's), each a slice of every buffer's
 * rows; as one call, row for row. Arguments as step_rows, the self-attention buffers `rows` wide. Returns 0; -1
 * when out of memory, -2 for a token outside the vocabulary (nothing written then). */
int mt_step(const int64_t *dims, const float *eps_scale, void *const *params, int rows, int t, int beam, int n_src,
            const int64_t *tokens, void *const *caches, const uint8_t *src_mask, float *logits, int threads) {
    if (known_tokens(tokens, rows, dims[VOCAB]) != 0) return -2;
    int sentences = rows / beam, parts = threads < sentences ? threads : sentences, status = 0;
    if (parts <= 1) return step_rows(dims, eps_scale, params, rows, rows, t, beam, n_src, tokens, caches, src_mask,
                                     logits);
    int d = dims[D_MODEL], buffers = 4 * dims[LAYERS];
    size_t per_sentence = (size_t)dims[HEADS] * n_src * (d / dims[HEADS]); /* of the encoder memory's keys */
    #pragma omp parallel for num_threads(parts) schedule(static, 1)
    for (int i = 0; i < parts; i++) {
        int first = (int)((int64_t)sentences * i / parts), stop = (int)((int64_t)sentences * (i + 1) / parts);
        void *own[buffers]; /* per layer: self keys, self values, memory keys, memory values */
        for (int b = 0; b < buffers; b++)
            own[b] = (float *)caches[b] + (b % 4 < 2 ? (size_t)first * beam * d : (size_t)first * per_sentence);
        int done = step_rows(dims, eps_scale, params, (stop - first) * beam, rows, t, beam, n_src,
                             tokens + (size_t)first * beam, own, src_mask + (size_t)first * n_src,
                             logits + (size_t)first * beam * dims[VOCAB]);
        if (done != 0) {
            #pragma omp atomic write
            status = done;
        }
    }
    return status;
}

/* The encoder for n sentences in shards of sentences, one per thread, as mt_step's; arguments as encode_rows,
 * returns as mt_step. */
int mt_encode(const int64_t *dims, const float *eps_scale, void *const *params, int n, int s, const int64_t *tokens,
              const uint8_t *src_mask, float *memory, int threads) {
    if (known_tokens(tokens, n * s, dims[VOCAB]) != 0) return -2;
    int parts = threads < n ? threads : n, status = 0;
    if (parts <= 1) return encode_rows(dims, eps_scale, params, n, s, tokens, src_mask, memory);
    #pragma omp parallel for num_threads(parts) schedule(static, 1)
    for (int i = 0; i < parts; i++) {
        int first = (int)((int64_t)n * i / parts), stop = (int)((int64_t)n * (i + 1) / parts);
        size_t at = (size_t)first * s;
        int done = encode_rows(dims, eps_scale, params, stop - first, s, tokens + at, src_mask + at,
                               memory + at * dims[D_MODEL]);
        if (done != 0) {
            #pragma omp atomic write
            status = done;
        }
    }
    return status;
}
