/*
 * status: the operator's page (GET / and /status on `serve` and on the gateway). It answers
 * six questions a buyer puts to any host, from live figures: where the cache sits, how long
 * entries are kept, whether every response reports its hits, how prefill and decode are split
 * and what time to first token looks like, how many users share the machine at what speed, and
 * how much capacity is spare; with --cost-per-hour, what a million tokens cost at the measured
 * rates.
 *
 * DESIGN. The routes note each finished request (status_note: traffic class, prompt / cached /
 * generated tokens, time to first token, the user's decode speed) into a ring of per-minute
 * buckets covering 24 hours, allocated once at status_new; a note adds into the current
 * minute's bucket (recycling it when it holds an older minute) and allocates nothing. The
 * windows (5 min, 1 h, 24 h) are sums over the buckets of their minutes, so a window answers
 * "the last N minutes" exactly, whatever the request rate. Engine busy time is a cumulative
 * counter the page samples (status_observe) when it is drawn or /metrics is scraped; the
 * utilisation of a window is the counter's rise over the oldest sample inside it.
 *
 * The page (status_page) is one HTML document with its charts drawn here as inline SVG: no
 * script, no external request (the route sends a Content-Security-Policy that forbids any),
 * and a meta refresh. Figures that /metrics also exports carry data-metric="NAME" with the same
 * value, so a test (or a curious operator) can hold the two side by side.
 *
 * Locks: one mutex guards the ring; status_note and status_window may run on any thread.
 */
#ifndef TM_STATUS_H
#define TM_STATUS_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/gc.h"
#include "engine/sched.h"
#include "util/bytebuf.h"

#define STATUS_MINUTES 1440           /* the ring: 24 h of one-minute buckets */
#define STATUS_LEN_N 4                /* input-length buckets of the TTFT figures */
#define STATUS_SPEED_N 20             /* per-user decode speed histogram bounds (tokens/s) */
#define STATUS_WINDOWS 3              /* 5 min, 1 h, 24 h */
#define STATUS_MAX_KEYS 16            /* API keys whose hits are kept apart (by their index) */

extern const int status_window_minutes[STATUS_WINDOWS];       /* 5, 60, 1440 */
extern const int status_len_bounds[STATUS_LEN_N - 1];         /* prompt tokens: 512, 2048, 8192 */
extern const double status_speed_bounds[STATUS_SPEED_N];      /* tokens/s upper bounds */

typedef struct status_ring status_ring;

/* One finished request, as the routes saw it. */
typedef struct {
    int cls;                  /* traffic class (index into the retention classes) */
    int key_slot;             /* 1 + index of the API key it carried; 0: none (so that a zeroed
                               * status_req names no key); past STATUS_MAX_KEYS: not kept apart */
    int n_prompt;             /* prompt tokens */
    int n_cached;             /* of which served from a cache tier */
    int n_gen;                /* tokens generated */
    double ttft_s;            /* seconds from submission to the first token; < 0: none */
    double decode_tps;        /* the user's tokens/s after the first token; <= 0: unknown */
} status_req;

/* The sums over one window's buckets. */
typedef struct {
    int minutes;                              /* the window's length */
    uint64_t n_req[GC_MAX_CLASSES];           /* finished requests by traffic class */
    uint64_t n_prompt[GC_MAX_CLASSES];        /* their prompt tokens */
    uint64_t n_cached[GC_MAX_CLASSES];        /* of which cached */
    uint64_t n_gen;                           /* generated tokens */
    uint64_t key_prompt[STATUS_MAX_KEYS];     /* prompt tokens by API key index */
    uint64_t key_cached[STATUS_MAX_KEYS];     /* of which cached */
    uint64_t ttft[STATUS_LEN_N][SCHED_HIST_N + 1]; /* TTFT counts per input-length bucket, over
                                                    * sched_hist_bounds (+Inf last) */
    double ttft_sum[STATUS_LEN_N];            /* their seconds */
    uint64_t speed[STATUS_SPEED_N + 1];       /* per-user decode speed counts (+Inf last) */
    double busy;                              /* engine busy fraction over the window; < 0: not
                                               * sampled twice in it yet */
    double busy_s;                            /* engine seconds over the window (busy * span) */
    double span_s;                            /* seconds the window covers (<= minutes * 60:
                                               * since the server started when younger) */
} status_window;

/* A ring that starts at wall time now (epoch seconds). */
status_ring *status_new(double now);
void status_free(status_ring *st);   /* NULL is ignored */

void status_note(status_ring *st, double now, const status_req *rq);
/* A sample of the cumulative engine busy seconds (sched_stats.step_s). */
void status_observe(status_ring *st, double now, double busy_s);
/* The last `minutes` minutes up to now (at most STATUS_MINUTES). */
void status_window_get(status_ring *st, double now, int minutes, status_window *w);
/* Generated tokens in each of the last n minutes, oldest first (n <= STATUS_MINUTES). */
void status_minutes_gen(status_ring *st, double now, int n, uint64_t *out);

/* The q-quantile (0..1) of a histogram with n_bounds upper bounds and n_bounds + 1 counts, as
 * Prometheus' histogram_quantile computes it (linear within the bucket, the first bucket from
 * 0; the +Inf bucket answers the last bound). -1 when empty. */
double status_quantile(const uint64_t *counts, const double *bounds, int n_bounds, double q);
/* The input-length bucket of a prompt of n tokens. */
int status_len_bucket(int n);

/* This machine's decode curve, from `tokenmill bench curves` (its "decode" points). */
#define STATUS_CURVE_MAX 16
typedef struct status_curve {
    int n;                                  /* points, by increasing streams */
    double streams[STATUS_CURVE_MAX];       /* concurrent decoding streams */
    double tok_s[STATUS_CURVE_MAX];         /* aggregate tokens/s */
    double user_tok_s[STATUS_CURVE_MAX];    /* tokens/s per stream */
} status_curve;

/* Reads the JSON `bench curves` wrote. 0, or -1 with err filled (unreadable, not that JSON,
 * no decode points, streams not increasing). */
int status_curve_load(const char *path, status_curve *c, char *err, size_t errsz);
/* Per-user tokens/s the curve gives at `streams` (linear between points, clamped at the ends). */
double status_curve_user_at(const status_curve *c, double streams);

/* What the page shows beyond the ring. Pointers may be NULL when there is nothing to show. */
typedef struct {
    const char *model_name;
    double now;                    /* wall seconds (epoch) */
    double started;                /* wall seconds the server started */
    const sched_stats *sched;      /* the local scheduler's counters (serve), or NULL (gateway) */
    const char *store_spec;        /* the block store's spec, or NULL: no store */
    uint64_t store_bytes;          /* bytes it holds (this process' view) */
    uint64_t store_capacity;       /* per-target capacity; 0: unlimited */
    uint64_t store_expired;        /* blocks deleted for TTL */
    uint64_t store_evicted;        /* blocks deleted for capacity */
    double store_oldest;           /* last use of its least recently used block, epoch s; 0: none */
    const gc_retention *retention; /* the traffic classes */
    double cost_per_hour;          /* the machine's price per hour; <= 0: not given */
    void (*cluster)(void *ud, bytebuf *b); /* appends the gateway's block (workers by role,
                                    * capacity advice, resumed requests) as HTML; NULL: none */
    void *cluster_ud;
    const char *role_text;         /* one line on the division of labour */
    const status_curve *curve;     /* this machine's measured decode curve, or NULL */
    int viewer_slot;               /* 1 + index of the API key the page's request carries: that
                                    * key's own hit shares are shown (no other key's); 0: none */
    const char *const *model_names; /* (n_models) every model the server serves, when several:
                                    * the page links each one's own page (?model=NAME) */
    int n_models;
} status_page_in;

/* Appends the page (a full HTML document) for the ring's state at in->now. */
void status_page(status_ring *st, const status_page_in *in, bytebuf *b);
/* A standalone-or-inline SVG line chart of n points (x[i], y[i]), the x values evenly spaced
 * in their order and labelled (sweeps are powers of two), y from 0 to the largest value: the
 * page's charts and `tokenmill bench curves` draw with the same code. */
void status_svg_line(bytebuf *b, const char *id, const char *title, const char *x_label, const char *y_label, int n,
                     const double *x, const double *y);
/* Appends z with &, <, >, " escaped (for the backend's HTML blocks too). */
void status_html_esc(bytebuf *b, const char *z);

#endif
