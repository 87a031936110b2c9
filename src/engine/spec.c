/*
 * spec: prompt lookup, acceptance estimates, the verify count and the acceptance rule of
 * speculative decoding. See spec.h for the design.
 */
#include "engine/spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

const char *spec_source_name(int i)
{
    static const char *const names[SPEC_N_SRC] = { "ngram", "model", "mtp" };
    return i >= 0 && i < SPEC_N_SRC ? names[i] : "?";
}

int spec_ngram_draft(const int32_t *toks, int n, int n_max, int n_min, int k_max, int32_t *out, float *prob)
{
    if (!toks || n < 2 || k_max <= 0 || n_min < 1) return 0;
    k_max = TM_MIN(k_max, SPEC_MAX_K);
    int lo = n > SPEC_NGRAM_WINDOW ? n - SPEC_NGRAM_WINDOW : 0;
    for (int len = TM_MIN(n_max, n - 1); len >= n_min; len--) {
        const int32_t *pat = toks + n - len;
        /* the most recent earlier occurrence: starts i < n - len, so a token follows it */
        int at = -1;
        for (int i = n - len - 1; i >= lo && at < 0; i--)
            if (toks[i] == pat[0] && !memcmp(toks + i, pat, (size_t)len * sizeof *toks)) at = i;
        if (at < 0) continue;
        /* the tokens that followed it, the draft itself once they run into the end (a copy
         * that overlaps its source): a loop of period p then drafts k_max tokens, not p */
        int k = k_max;
        for (int j = 0; j < k; j++) {
            int src = at + len + j;
            out[j] = src < n ? toks[src] : out[src - n];
        }
        if (!prob) return k;
        /* each occurrence's continuation against the draft: cand[j] occurrences agree with
         * drafts 0..j-1 and have a j-th token among the real ones, agree[j] of them agree with
         * draft j too (1/2 where none says anything) */
        int cand[SPEC_MAX_K] = { 0 }, agree[SPEC_MAX_K] = { 0 };
        for (int i = at; i >= lo; i--) {
            if (toks[i] != pat[0] || memcmp(toks + i, pat, (size_t)len * sizeof *toks)) continue;
            const int32_t *c = toks + i + len;
            int avail = TM_MIN(k, n - (i + len));
            for (int j = 0; j < avail; j++) {
                cand[j]++;
                if (c[j] != out[j]) break;
                agree[j]++;
            }
        }
        /* the draft repeats the period d = n - len - at; the most recent occurrence shows
         * its first d tokens, so only a draft past that, in a loop's first repetition, can
         * lack any occurrence: it is the token one period back again, as likely as that one
         * (a loop that came round once tends to come round again; priced at 1/2, a new
         * loop's later drafts were left unverified though they passed) */
        int d = n - len - at;
        for (int j = 0; j < k; j++)
            prob[j] = cand[j] > 0 || j < d ? (float)((agree[j] + 1.0) / (cand[j] + 2.0)) : prob[j - d];
        return k;
    }
    return 0;
}

static void spec_seq_init_decay(spec_seq *q, double decay)
{
    memset(q, 0, sizeof *q);
    q->decay = decay;
    for (int k = 0; k < SPEC_RATES; k++) {
        q->prior[k] = q->rate[k] = SPEC_ACCEPT_PRIOR;
        q->wprior[k] = 1;
    }
}

void spec_seq_init(spec_seq *q) { spec_seq_init_decay(q, SPEC_ACCEPT_DECAY); }

void spec_seq_init_shared(spec_seq *q) { spec_seq_init_decay(q, SPEC_SHARED_DECAY); }

bool spec_seq_proven(const spec_seq *all) { return all->n_tested >= SPEC_PRIOR_MIN_TESTED; }

void spec_seq_prior(spec_seq *q, const spec_seq *all)
{
    if (!spec_seq_proven(all)) return;
    for (int k = 0; k < SPEC_RATES; k++) {
        q->prior[k] = all->rate[k];
        q->rate[k] = q->wprior[k] * q->prior[k] + q->own[k];
    }
    if (q->n_tested == 0 || q->mean_prob == 0) q->mean_prob = all->mean_prob;
}

void spec_seq_observe(spec_seq *q, int n_accepted, bool rejected, const float *prob)
{
    for (int i = 0; i < n_accepted + (rejected ? 1 : 0); i++) {
        double hit = i < n_accepted ? 1.0 : 0.0;
        const int slots[2] = { TM_MIN(i, SPEC_MAX_K - 1), SPEC_POOLED };
        for (int j = 0; j < 2; j++) {
            int k = slots[j];
            q->own[k] = q->decay * q->own[k] + (1 - q->decay) * hit;
            q->wprior[k] *= q->decay;
            q->rate[k] = q->wprior[k] * q->prior[k] + q->own[k];
        }
        if (prob) q->mean_prob = q->mean_prob > 0 ? q->decay * q->mean_prob + (1 - q->decay) * prob[i] : prob[i];
    }
    q->n_tested += (uint64_t)(n_accepted + (rejected ? 1 : 0));
    q->n_accepted += (uint64_t)n_accepted;
}

void spec_seq_gains(const spec_seq *q, const float *prob, int n, double *out)
{
    double g = 1;
    for (int k = 0; k < n; k++) {
        double a = prob && q->mean_prob > 0 ? TM_MIN(1.0, prob[k] * q->rate[SPEC_POOLED] / q->mean_prob)
                                             : q->rate[TM_MIN(k, SPEC_MAX_K - 1)];
        g *= a;
        out[k] = g;
    }
}

int spec_seq_draft_len(const spec_seq *q, int k_max, double min_gain, bool probe)
{
    if (k_max < 1 || (q->rate[0] < min_gain && !probe)) return 0;
    int n = 1;
    double g = q->rate[0];
    while (n < TM_MIN(k_max, SPEC_MAX_K) && (g *= q->rate[n]) >= min_gain) n++;
    return n;
}

void spec_probe_init(spec_probe *p)
{
    p->gap = SPEC_PROBE_STEPS;
    p->quiet = p->gap;
}

bool spec_probe_due(const spec_probe *p) { return p->quiet >= p->gap; }

void spec_probe_step(spec_probe *p, int verified, int accepted)
{
    if (verified <= 0) {
        if (p->quiet < SPEC_PROBE_MAX) p->quiet++;
        return;
    }
    p->quiet = 0;
    p->gap = accepted > 0 ? SPEC_PROBE_STEPS : TM_MIN(2 * p->gap, SPEC_PROBE_MAX);
}

void spec_probe_force(spec_probe *p) { p->quiet = p->gap; }

void spec_probe_taken(spec_probe *p) { p->quiet = 0; }

struct spec_chooser {
    int max_seqs;
    int *heap;                  /* (max_seqs) sequence ids, max-heap by their next draft's gain */
    int *order;                 /* (max_seqs * SPEC_MAX_K) sequence id of the j-th draft taken */
    int *taken;                 /* (max_seqs) drafts of each taken so far */
};

spec_chooser *spec_chooser_new(int max_seqs)
{
    if (max_seqs < 1) return NULL;
    spec_chooser *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->max_seqs = max_seqs;
    c->heap = malloc((size_t)max_seqs * sizeof *c->heap);
    c->order = malloc((size_t)max_seqs * SPEC_MAX_K * sizeof *c->order);
    c->taken = malloc((size_t)max_seqs * sizeof *c->taken);
    if (!c->heap || !c->order || !c->taken) {
        spec_chooser_free(c);
        return NULL;
    }
    return c;
}

void spec_chooser_free(spec_chooser *c)
{
    if (!c) return;
    free(c->heap);
    free(c->order);
    free(c->taken);
    free(c);
}

/* The gain of sequence i's next draft (the heap key); lower id first on a tie, so the
 * choice does not depend on the heap's history. */
static bool spec_heap_before(const spec_chooser *c, const double *gains, int a, int b)
{
    double ga = gains[(size_t)a * SPEC_MAX_K + c->taken[a]], gb = gains[(size_t)b * SPEC_MAX_K + c->taken[b]];
    return ga > gb || (ga == gb && a < b);
}

static void spec_heap_down(spec_chooser *c, const double *gains, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && spec_heap_before(c, gains, c->heap[l], c->heap[m])) m = l;
        if (r < n && spec_heap_before(c, gains, c->heap[r], c->heap[m])) m = r;
        if (m == i) return;
        int t = c->heap[i];
        c->heap[i] = c->heap[m];
        c->heap[m] = t;
        i = m;
    }
}

int spec_choose(spec_chooser *c, int n_seqs, const double *gains, const int *n_draft, double base_tokens,
                int max_extra, spec_time_fn time, void *time_arg, double round_s, int *k)
{
    if (!c || n_seqs < 0 || n_seqs > c->max_seqs) return -1;
    double t0 = time(time_arg, 0);
    if (!(t0 > 0)) return -1;
    if (!(round_s > 0)) round_s = 0;
    t0 += round_s;
    int n = 0;
    for (int i = 0; i < n_seqs; i++) {
        c->taken[i] = 0;
        if (n_draft[i] > 0 && gains[(size_t)i * SPEC_MAX_K] > 0) c->heap[n++] = i;
    }
    for (int i = n / 2 - 1; i >= 0; i--) spec_heap_down(c, gains, n, i);
    double e = base_tokens, best = base_tokens / t0;
    int best_j = 0, j = 0;
    while (n > 0 && j < max_extra) {
        int i = c->heap[0];
        e += gains[(size_t)i * SPEC_MAX_K + c->taken[i]];
        c->taken[i]++;
        c->order[j++] = i;
        if (c->taken[i] >= TM_MIN(n_draft[i], SPEC_MAX_K) || !(gains[(size_t)i * SPEC_MAX_K + c->taken[i]] > 0))
            c->heap[0] = c->heap[--n];
        spec_heap_down(c, gains, n, 0);
        double t = time(time_arg, j);
        if (t > 0 && e / (t + round_s) > best * (1 + 1e-9)) {
            t += round_s;
            best = e / t;
            best_j = j;
        }
    }
    for (int i = 0; i < n_seqs; i++) k[i] = 0;
    for (int x = 0; x < best_j; x++) k[c->order[x]]++;
    return best_j;
}

/* Draws from norm(max(0, p - q)) (q NULL: norm(max(0, p))) with u in [0, 1), sum being the
 * weights' total (> 0). */
static int32_t spec_draw(const float *p, const float *q, int n, double sum, double u)
{
    double t = u * sum, acc = 0;
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        double w = q ? (double)p[i] - (double)q[i] : (double)p[i];
        if (!(w > 0)) continue;
        acc += w;
        last = i;
        if (t < acc) return i;
    }
    return last;   /* rounding left t at the very end */
}

int32_t spec_verify_token(const float *p, const float *q, int n, int32_t d, double u_accept, double u_resample,
                          bool *accepted)
{
    *accepted = false;
    if (!p || !q || n < 1 || d < 0 || d >= n) return -1;
    double pd = p[d], qd = q[d];
    if (qd > 0 && u_accept < pd / qd) {   /* min(1, p/q): u < 1 always passes when p >= q */
        *accepted = true;
        return d;
    }
    double sum = 0;
    for (int i = 0; i < n; i++) {
        double w = (double)p[i] - (double)q[i];
        if (w > 0) sum += w;
    }
    if (sum > 0) return spec_draw(p, q, n, sum, u_resample);
    /* p == q within rounding yet rejected (q(d) = 0 or rounding): draw from p itself */
    sum = 0;
    for (int i = 0; i < n; i++) sum += p[i] > 0 ? p[i] : 0;
    return sum > 0 ? spec_draw(p, NULL, n, sum, u_resample) : d;
}
