/* Beam search's helpers beside the C decoding step (native_step.c), for searches over a few rows
 * (mt/decode/few_rows.py): each row's best tokens with their log-probabilities, and the cache rows a step moves.
 * Compiled into the same library (mt/fast/native_step.py). */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Beam search's reordering of the self-attention caches in place (DecoderCache.select): in each of `n_buffers`
 * buffers, (length, rows, row_floats) floats, row from[i] is copied to row to[i] at every filled position, every
 * source read before any row is written. Returns 0, or -1 when out of memory. */
int mt_move_rows(void *const *buffers, int n_buffers, int length, int rows, int row_floats, const int64_t *to,
                 const int64_t *from, int moved) {
    float *held = malloc(sizeof(float) * (size_t)moved * row_floats);
    if (!held) return -1;
    for (int b = 0; b < n_buffers; b++)
        for (int t = 0; t < length; t++) {
            float *at = (float *)buffers[b] + (size_t)t * rows * row_floats;
            for (int i = 0; i < moved; i++)
                memcpy(held + (size_t)i * row_floats, at + from[i] * row_floats, sizeof(float) * row_floats);
            for (int i = 0; i < moved; i++)
                memcpy(at + to[i] * row_floats, held + (size_t)i * row_floats, sizeof(float) * row_floats);
        }
    free(held);
    return 0;
}

/* The first n of 8 floats at p (n >= 8: all of them). */
ALWAYS_INLINE __m256 load_upto(const float *p, int n) {
    return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

/* e^x in eight lanes, to within a few units in the last place (Cephes' expf: x = n ln 2 + r, a polynomial in r). */
ALWAYS_INLINE __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-88.3762626647949f));
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(x, x), x), _mm256_set1_ps(1.0f));
    __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(two_n));
}

/* Beam search's candidates: for each of `rows` rows of logits, (rows, vocab), its `width` most likely tokens other
 * than `barred` (-1: none), best first (the lower token first among equals), and their log-probabilities,
 * log-softmax over the whole row; the rows shared among `threads` threads. */
void mt_top_logprobs(const float *logits, int rows, int vocab, int width, int barred, float *values,
                     int64_t *tokens, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && rows > 1)
    for (int r = 0; r < rows; r++) {
        const float *x = logits + (size_t)r * vocab;
        float *best = values + (size_t)r * width;
        int64_t *at = tokens + (size_t)r * width;
        int found = 0;
        float bar = -INFINITY; /* what a token must pass to be kept: the last kept one, once `width` are */
        int i = 0;
        for (; i < vocab; i += 8) { /* eight at a time: most rows' tokens fall below the bar at once */
            int lanes = vocab - i < 8 ? vocab - i : 8;
            unsigned passed = (unsigned)_mm256_movemask_ps(
                _mm256_cmp_ps(load_upto(x + i, lanes), _mm256_set1_ps(bar), _CMP_GT_OQ)) & ((1u << lanes) - 1);
            if (found < width) passed = (1u << lanes) - 1; /* -inf and NaN too, until `width` are kept */
            for (; passed; passed &= passed - 1) {
                int k = i + __builtin_ctz(passed);
                if (k == barred || (found == width && !(x[k] > best[width - 1]))) continue;
                int j = found < width ? found++ : width - 1;
                for (; j > 0 && x[k] > best[j - 1]; j--) best[j] = best[j - 1], at[j] = at[j - 1];
                best[j] = x[k], at[j] = k;
                if (found == width) bar = best[width - 1];
            }
        }
        for (; found < width; found++) best[found] = -INFINITY, at[found] = 0; /* a vocabulary under `width` */
        float top = best[0]; /* the row's largest, as exp's range wants it */
        if (barred >= 0 && barred < vocab && x[barred] > top) top = x[barred];
        __m256 lanes = _mm256_setzero_ps(), shift = _mm256_set1_ps(top);
        for (i = 0; i + 8 <= vocab; i += 8) lanes = _mm256_add_ps(lanes, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift)));
        float sums[8], total = 0.0f;
        _mm256_storeu_ps(sums, lanes);
        for (int k = 0; k < 8; k++) total += sums[k];
        for (; i < vocab; i++) total += expf(x[i] - top);
        float log_total = top + logf(total);
        for (int k = 0; k < width; k++) best[k] -= log_total;
    }
}

int mt_step(const int64_t *dims, const float *eps_scale, void *const *params, int rows, int t, int beam, int n_src,
            const int64_t *tokens, void *const *caches, const uint8_t *src_mask, float *logits, int threads);

/* Greedy search over `rows` rows (a sentence each) from position 0 with the C step, as mt/decode/few_rows.py's
 * `few_greedy` searches: each row's most likely token (EOS barred before `min_len`; EOS, log-probability 0, at the
 * row's limit), until every row has ended or `steps` steps; ended rows decode on, their outputs ignored. Writes each
 * row's tokens before EOS into `found` (rows, steps), their count into `lengths`, the summed log-probabilities into
 * `logprobs`. Returns mt_step's status: 0, or -1 when out of memory. */
int mt_greedy(const int64_t *dims, const float *eps_scale, void *const *params, int rows, int n_src, int steps,
              int vocab, int min_len, int bos, int eos, const int64_t *limits, void *const *caches,
              const uint8_t *src_mask, int64_t *found, int64_t *lengths, float *logprobs) {
    float *logits = malloc(sizeof(float) * (size_t)rows * vocab);
    int64_t *last = malloc(sizeof(int64_t) * rows);
    char *ended = calloc(rows, 1);
    int status = logits && last && ended ? 0 : -1;
    for (int r = 0; r < rows; r++) last[r] = bos, lengths[r] = 0, logprobs[r] = 0.0f;
    for (int t = 0; t < steps && status == 0; t++) {
        status = mt_step(dims, eps_scale, params, rows, t, 1, n_src, last, caches, src_mask, logits, 1);
        int running = 0;
        for (int r = 0; r < rows && status == 0; r++) {
            if (ended[r]) continue;
            float best = 0.0f;
            int64_t token = eos;
            if (limits[r] > t + 1) mt_top_logprobs(logits + (size_t)r * vocab, 1, vocab, 1, t < min_len ? eos : -1,
                                                   &best, &token, 1);
            logprobs[r] += best;
            last[r] = token;
            if (token == eos) {
                ended[r] = 1;
            } else {
                found[(size_t)r * steps + lengths[r]++] = token;
                running++;
            }
        }
        if (!running) break;
    }
    free(logits);
    free(last);
    free(ended);
    return status;
}

typedef struct { double score; int parent; int64_t token; } Candidate;

/* Sorts `c` by score, highest first, keeping equals in their order (as Python's sorted, stable). */
static void sort_candidates(Candidate *c, int n) {
    for (int i = 1; i < n; i++) {
        Candidate x = c[i];
        int j = i;
        for (; j > 0 && c[j - 1].score < x.score; j--) c[j] = c[j - 1];
        c[j] = x;
    }
}

/* Beam search of one sentence over `beam` rows with the C step, as mt/decode/few_rows.py's `few_beam_search`
 * searches it: each row's 2 * beam best tokens (EOS barred before `min_len`; only EOS, log-probability 0, at step
 * `limit`), a hypothesis finished where EOS is among the `beam` best candidates, the live beams kept in their parents'
 * slots (`few_slot_order`) and the cache's moved rows copied, until no live beam can beat the `nbest`-th finished one
 * (GNMT length penalty `alpha`). Writes up to `nbest` hypotheses, best first: their tokens (nbest, limit), lengths,
 * scores and log-probabilities, and returns how many; -1 when out of memory. `caches` as mt_step's; `self_caches`
 * the self-attention buffers alone, as mt_move_rows's. */
int mt_beam(const int64_t *dims, const float *eps_scale, void *const *params, int beam, int n_src, int limit,
            int vocab, int min_len, int bos, int eos, double alpha, int nbest, void *const *caches,
            void *const *self_caches, int n_self, int row_floats, const uint8_t *src_mask, int64_t *found,
            int64_t *lengths, double *scores_out, double *logprobs_out) {
    int width = 2 * beam, held = nbest + beam;
    float *logits = malloc(sizeof(float) * (size_t)beam * vocab), *lp = malloc(sizeof(float) * width);
    int64_t *last = malloc(sizeof(int64_t) * beam), *tok = malloc(sizeof(int64_t) * width);
    int64_t *prefix = malloc(sizeof(int64_t) * 2 * (size_t)beam * limit);
    int64_t *hyp_tokens = malloc(sizeof(int64_t) * (size_t)held * limit);
    int64_t *to = malloc(sizeof(int64_t) * beam), *from = malloc(sizeof(int64_t) * beam);
    Candidate *cand = malloc(sizeof(Candidate) * (size_t)beam * width), live[32];
    double *score = malloc(sizeof(double) * beam), *hyp_score = malloc(sizeof(double) * held);
    double *hyp_logprob = malloc(sizeof(double) * held);
    int *hyp_length = malloc(sizeof(int) * held), *order = malloc(sizeof(int) * beam), n_hyps = 0, status = 0;
    if (!logits || !lp || !last || !tok || !prefix || !hyp_tokens || !to || !from || !cand || !score || !hyp_score ||
        !hyp_logprob || !hyp_length || !order || beam > 16) {
        status = -1;
        goto done;
    }
    int64_t *now = prefix, *next = prefix + (size_t)beam * limit;
    for (int j = 0; j < beam; j++) last[j] = bos, score[j] = j ? -INFINITY : 0.0;
    for (int t = 0; t < limit; t++) {
        if (mt_step(dims, eps_scale, params, beam, t, beam, n_src, last, caches, src_mask, logits, 1) != 0) {
            status = -1;
            goto done;
        }
        double penalty = pow((5.0 + (t + 1)) / 6.0, alpha);
        int n = 0;
        for (int j = 0; j < beam; j++) {
            if (t + 1 >= limit) { /* the last step: only EOS */
                cand[n++] = (Candidate){score[j], j, eos};
                for (int w = 1; w < width; w++) cand[n++] = (Candidate){-INFINITY, j, eos};
                continue;
            }
            mt_top_logprobs(logits + (size_t)j * vocab, 1, vocab, width, t < min_len ? eos : -1, lp, tok, 1);
            for (int w = 0; w < width; w++) cand[n++] = (Candidate){score[j] + (double)lp[w], j, tok[w]};
        }
        sort_candidates(cand, n);
        for (int c = 0; c < beam; c++) { /* Finished.add: kept sorted, equals in the order they came */
            if (cand[c].token != eos || !(cand[c].score > -INFINITY)) continue;
            double normed = cand[c].score / penalty;
            int at = n_hyps < held ? n_hyps++ : held - 1;
            for (; at > 0 && hyp_score[at - 1] < normed; at--) {
                hyp_score[at] = hyp_score[at - 1], hyp_logprob[at] = hyp_logprob[at - 1];
                hyp_length[at] = hyp_length[at - 1];
                memcpy(hyp_tokens + (size_t)at * limit, hyp_tokens + (size_t)(at - 1) * limit, sizeof(int64_t) * t);
            }
            hyp_score[at] = normed, hyp_logprob[at] = cand[c].score, hyp_length[at] = t;
            memcpy(hyp_tokens + (size_t)at * limit, now + (size_t)cand[c].parent * limit, sizeof(int64_t) * t);
            if (n_hyps > nbest) n_hyps = nbest;
        }
        double kth_best = n_hyps >= nbest ? hyp_score[nbest - 1] : -INFINITY;
        int n_live = n < width ? n : width;
        for (int c = 0; c < n_live; c++)
            live[c] = cand[c], live[c].score = cand[c].token == eos ? -INFINITY : cand[c].score;
        sort_candidates(live, n_live);
        if (!(kth_best < live[0].score / penalty)) break; /* no live beam can beat the nbest-th finished one */
        /* few_slot_order: a parent's first child keeps its slot, the others fill the childless slots in order */
        int slot[16], childless = 0, taken[16] = {0};
        for (int c = 0; c < beam; c++) taken[live[c].parent] = 1;
        for (int c = 0; c < beam; c++) {
            int first = 1;
            for (int e = 0; e < c; e++) first &= live[e].parent != live[c].parent;
            if (first) {
                slot[c] = live[c].parent;
            } else {
                while (taken[childless]) childless++;
                slot[c] = childless++;
            }
        }
        for (int c = 0; c < beam; c++) order[slot[c]] = c;
        int moved = 0;
        for (int at = 0; at < beam; at++) {
            Candidate chosen = live[order[at]];
            if (chosen.parent != at) to[moved] = at, from[moved] = chosen.parent, moved++;
            memcpy(next + (size_t)at * limit, now + (size_t)chosen.parent * limit, sizeof(int64_t) * t);
            next[(size_t)at * limit + t] = chosen.token;
            last[at] = chosen.token, score[at] = chosen.score;
        }
        int64_t *swap = now;
        now = next, next = swap;
        if (moved && mt_move_rows(self_caches, n_self, t + 1, beam, row_floats, to, from, moved) != 0) {
            status = -1;
            goto done;
        }
    }
    for (int h = 0; h < n_hyps; h++) {
        memcpy(found + (size_t)h * limit, hyp_tokens + (size_t)h * limit, sizeof(int64_t) * hyp_length[h]);
        lengths[h] = hyp_length[h], scores_out[h] = hyp_score[h], logprobs_out[h] = hyp_logprob[h];
    }
    status = n_hyps;
done:
    free(logits), free(lp), free(last), free(tok), free(prefix), free(hyp_tokens), free(to), free(from), free(cand);
    free(score), free(hyp_score), free(hyp_logprob), free(hyp_length), free(order);
    return status;
}
