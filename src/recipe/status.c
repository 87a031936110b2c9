/*
 * status: the per-minute ring of finished requests and the operator's page drawn from it.
 * See status.h for the design. The page's charts are SVG written here: bars scaled to the
 * largest value of their chart, every bar at least one pixel wide so that an all-zero chart
 * still shows its rows.
 */
#include "recipe/status.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/util.h"

const int status_window_minutes[STATUS_WINDOWS] = { 5, 60, 1440 };
const int status_len_bounds[STATUS_LEN_N - 1] = { 512, 2048, 8192 };
const double status_speed_bounds[STATUS_SPEED_N] = {
    1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100, 150, 200, 300, 500, 700, 1000, 2000, 5000,
};
static const char *const status_window_names[STATUS_WINDOWS] = { "5 min", "1 h", "24 h" };
static const char *const status_len_names[STATUS_LEN_N] = { "&lt; 512", "512 – 2k", "2k – 8k", "&ge; 8k" };

typedef struct {
    int64_t minute;                           /* epoch minute held; -1: none yet */
    uint64_t n_req[GC_MAX_CLASSES];           /* finished requests by class */
    uint64_t n_prompt[GC_MAX_CLASSES];        /* prompt tokens by class */
    uint64_t n_cached[GC_MAX_CLASSES];        /* cached prompt tokens by class */
    uint64_t n_gen;                           /* generated tokens */
    uint64_t key_prompt[STATUS_MAX_KEYS];     /* prompt tokens by API key index */
    uint64_t key_cached[STATUS_MAX_KEYS];     /* cached prompt tokens by API key index */
    uint32_t ttft[STATUS_LEN_N][SCHED_HIST_N + 1]; /* TTFT counts by input length */
    double ttft_sum[STATUS_LEN_N];            /* seconds */
    uint32_t speed[STATUS_SPEED_N + 1];       /* per-user decode speed counts */
    double busy0_s, busy0_t;                  /* first busy sample of the minute (cumulative
                                               * engine seconds, wall time); busy0_t 0: none */
} status_bucket;

struct status_ring {
    pthread_mutex_t mu;
    double started;                           /* wall seconds at status_new */
    double busy_s, busy_t;                    /* the latest busy sample; busy_t 0: none */
    status_bucket ring[STATUS_MINUTES];       /* minute m lives at m % STATUS_MINUTES */
};

status_ring *status_new(double now)
{
    status_ring *st = xcalloc(1, sizeof *st);
    pthread_mutex_init(&st->mu, NULL);
    st->started = now;
    for (int i = 0; i < STATUS_MINUTES; i++) st->ring[i].minute = -1;
    return st;
}

void status_free(status_ring *st)
{
    if (!st) return;
    pthread_mutex_destroy(&st->mu);
    free(st);
}

static int64_t status_minute(double now) { return (int64_t)floor(now / 60.0); }

/* The bucket of now's minute, emptied first when it held an older one. Caller holds mu. */
static status_bucket *status_bucket_at(status_ring *st, double now)
{
    int64_t m = status_minute(now);
    status_bucket *b = &st->ring[m % STATUS_MINUTES];
    if (b->minute != m) {
        memset(b, 0, sizeof *b);
        b->minute = m;
    }
    return b;
}

int status_len_bucket(int n)
{
    int i = 0;
    while (i < STATUS_LEN_N - 1 && n >= status_len_bounds[i]) i++;
    return i;
}

static int status_hist_index(const double *bounds, int n_bounds, double v)
{
    int i = 0;
    while (i < n_bounds && v > bounds[i]) i++;
    return i;
}

void status_note(status_ring *st, double now, const status_req *rq)
{
    int cls = rq->cls >= 0 && rq->cls < GC_MAX_CLASSES ? rq->cls : 0;
    pthread_mutex_lock(&st->mu);
    status_bucket *b = status_bucket_at(st, now);
    b->n_req[cls]++;
    b->n_prompt[cls] += (uint64_t)TM_MAX(rq->n_prompt, 0);
    b->n_cached[cls] += (uint64_t)TM_MAX(rq->n_cached, 0);
    b->n_gen += (uint64_t)TM_MAX(rq->n_gen, 0);
    if (rq->key_slot > 0 && rq->key_slot <= STATUS_MAX_KEYS) {
        b->key_prompt[rq->key_slot - 1] += (uint64_t)TM_MAX(rq->n_prompt, 0);
        b->key_cached[rq->key_slot - 1] += (uint64_t)TM_MAX(rq->n_cached, 0);
    }
    if (rq->ttft_s >= 0) {
        int l = status_len_bucket(rq->n_prompt);
        b->ttft[l][status_hist_index(sched_hist_bounds, SCHED_HIST_N, rq->ttft_s)]++;
        b->ttft_sum[l] += rq->ttft_s;
    }
    if (rq->decode_tps > 0) b->speed[status_hist_index(status_speed_bounds, STATUS_SPEED_N, rq->decode_tps)]++;
    pthread_mutex_unlock(&st->mu);
}

void status_observe(status_ring *st, double now, double busy_s)
{
    pthread_mutex_lock(&st->mu);
    status_bucket *b = status_bucket_at(st, now);
    if (!b->busy0_t) {
        b->busy0_s = busy_s;
        b->busy0_t = now;
    }
    st->busy_s = busy_s;
    st->busy_t = now;
    pthread_mutex_unlock(&st->mu);
}

void status_window_get(status_ring *st, double now, int minutes, status_window *w)
{
    memset(w, 0, sizeof *w);
    minutes = TM_MAX(1, TM_MIN(minutes, STATUS_MINUTES));
    w->minutes = minutes;
    int64_t cur = status_minute(now);
    double span = (minutes - 1) * 60.0 + (now - (double)cur * 60.0);
    w->span_s = TM_MAX(0.0, TM_MIN(span, now - st->started));
    w->busy = -1;
    pthread_mutex_lock(&st->mu);
    const status_bucket *oldest = NULL;   /* the oldest bucket of the window with a busy sample */
    for (int k = minutes - 1; k >= 0; k--) {
        int64_t m = cur - k;
        if (m < 0) continue;
        const status_bucket *b = &st->ring[m % STATUS_MINUTES];
        if (b->minute != m) continue;
        for (int c = 0; c < GC_MAX_CLASSES; c++) {
            w->n_req[c] += b->n_req[c];
            w->n_prompt[c] += b->n_prompt[c];
            w->n_cached[c] += b->n_cached[c];
        }
        w->n_gen += b->n_gen;
        for (int key = 0; key < STATUS_MAX_KEYS; key++) {
            w->key_prompt[key] += b->key_prompt[key];
            w->key_cached[key] += b->key_cached[key];
        }
        for (int l = 0; l < STATUS_LEN_N; l++) {
            for (int i = 0; i <= SCHED_HIST_N; i++) w->ttft[l][i] += b->ttft[l][i];
            w->ttft_sum[l] += b->ttft_sum[l];
        }
        for (int i = 0; i <= STATUS_SPEED_N; i++) w->speed[i] += b->speed[i];
        if (!oldest && b->busy0_t) oldest = b;
    }
    if (oldest && st->busy_t > oldest->busy0_t) {
        w->busy_s = st->busy_s - oldest->busy0_s;
        w->busy = TM_MIN(1.0, TM_MAX(0.0, w->busy_s / (st->busy_t - oldest->busy0_t)));
    }
    pthread_mutex_unlock(&st->mu);
}

void status_minutes_gen(status_ring *st, double now, int n, uint64_t *out)
{
    n = TM_MIN(n, STATUS_MINUTES);
    int64_t cur = status_minute(now);
    pthread_mutex_lock(&st->mu);
    for (int k = 0; k < n; k++) {
        int64_t m = cur - (n - 1 - k);
        const status_bucket *b = m >= 0 ? &st->ring[m % STATUS_MINUTES] : NULL;
        out[k] = b && b->minute == m ? b->n_gen : 0;
    }
    pthread_mutex_unlock(&st->mu);
}

double status_quantile(const uint64_t *counts, const double *bounds, int n_bounds, double q)
{
    uint64_t n = 0;
    for (int i = 0; i <= n_bounds; i++) n += counts[i];
    if (!n) return -1;
    double rank = q * (double)n, cum = 0;
    for (int i = 0; i < n_bounds; i++) {
        if (counts[i] && cum + (double)counts[i] >= rank) {
            double lo = i ? bounds[i - 1] : 0, hi = bounds[i];
            return lo + (hi - lo) * (rank - cum) / (double)counts[i];
        }
        cum += (double)counts[i];
    }
    return bounds[n_bounds - 1];
}

/* ------------------------------------------------------------------ the decode curve */

int status_curve_load(const char *path, status_curve *c, char *err, size_t errsz)
{
    memset(c, 0, sizeof *c);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        snprintf(err, errsz, "%s: %s", path, je.text);
        return -1;
    }
    json_t *dec = json_object_get(root, "decode");
    size_t i;
    json_t *pt;
    int rc = 0;
    if (!json_is_array(dec) || !json_array_size(dec) || json_array_size(dec) > STATUS_CURVE_MAX) {
        snprintf(err, errsz, "%s: want the JSON of `tokenmill bench curves` (1..%d \"decode\" points)", path, STATUS_CURVE_MAX);
        rc = -1;
    }
    json_array_foreach(dec, i, pt) {
        if (rc) break;
        json_t *s = json_object_get(pt, "streams"), *t = json_object_get(pt, "tok_s"), *u = json_object_get(pt, "per_user_tok_s");
        if (!json_is_number(s) || !json_is_number(t) || !json_is_number(u) || json_number_value(s) < 1 ||
            (c->n && json_number_value(s) <= c->streams[c->n - 1])) {
            snprintf(err, errsz, "%s: decode point %zu: want increasing streams >= 1, tok_s and per_user_tok_s", path, i);
            rc = -1;
            break;
        }
        c->streams[c->n] = json_number_value(s);
        c->tok_s[c->n] = json_number_value(t);
        c->user_tok_s[c->n] = json_number_value(u);
        c->n++;
    }
    json_decref(root);
    return rc;
}

double status_curve_user_at(const status_curve *c, double streams)
{
    if (c->n == 0) return -1;
    if (streams <= c->streams[0]) return c->user_tok_s[0];
    for (int i = 1; i < c->n; i++)
        if (streams <= c->streams[i]) {
            double f = (streams - c->streams[i - 1]) / (c->streams[i] - c->streams[i - 1]);
            return c->user_tok_s[i - 1] + f * (c->user_tok_s[i] - c->user_tok_s[i - 1]);
        }
    return c->user_tok_s[c->n - 1];
}

/* ------------------------------------------------------------------ the page */

void status_html_esc(bytebuf *b, const char *z)
{
    for (; z && *z; z++) {
        switch (*z) {
        case '&': bytebuf_puts(b, "&amp;"); break;
        case '<': bytebuf_puts(b, "&lt;"); break;
        case '>': bytebuf_puts(b, "&gt;"); break;
        case '"': bytebuf_puts(b, "&quot;"); break;
        default: bytebuf_putc(b, *z);
        }
    }
}

/* A byte count as "12.3 GiB". */
static void page_bytes(bytebuf *b, uint64_t n)
{
    static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 5) { v /= 1024; u++; }
    bytebuf_printf(b, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

static void page_duration(bytebuf *b, double s)
{
    if (s >= 86400 && fmod(s, 86400) == 0) bytebuf_printf(b, "%.0f d", s / 86400);
    else if (s >= 3600) bytebuf_printf(b, "%.3g h", s / 3600);
    else if (s >= 60) bytebuf_printf(b, "%.3g min", s / 60);
    else bytebuf_printf(b, "%.3g s", s);
}

/* A share 0..1 as a percentage, "–" when undefined (den 0). */
static void page_share(bytebuf *b, double num, double den)
{
    if (den > 0) bytebuf_printf(b, "%.1f %%", 100.0 * num / den);
    else bytebuf_puts(b, "–");
}

/* Seconds as "37 ms" / "1.25 s", "–" when negative (none). */
static const char *page_fmt_secs(char *buf, size_t cap, double s)
{
    if (s < 0) snprintf(buf, cap, "–");
    else if (s < 1) snprintf(buf, cap, "%.0f ms", s * 1e3);
    else snprintf(buf, cap, "%.2f s", s);
    return buf;
}

static void page_secs(bytebuf *b, double s)
{
    char buf[32];
    bytebuf_puts(b, page_fmt_secs(buf, sizeof buf, s));
}

/* A per-user speed quantile; the open-ended top bucket reads "at least". */
static void page_speed(bytebuf *b, double q)
{
    if (q < 0) bytebuf_puts(b, "<td>–</td>");
    else if (q >= status_speed_bounds[STATUS_SPEED_N - 1]) bytebuf_printf(b, "<td>&ge; %.0f</td>", q);
    else bytebuf_printf(b, "<td>%.1f</td>", q);
}

/* A figure /metrics also has: the value is printed as /metrics prints it (%.17g). */
static void page_metric(bytebuf *b, const char *label, const char *name, double v)
{
    bytebuf_printf(b, "<div class=\"fig\"><span class=\"v\" data-metric=\"%s\">%.17g</span><span class=\"l\">%s</span></div>",
                   name, v, label);
}

/* A horizontal bar chart: n rows of label, bar and value text (already formatted). A rule
 * (0..1 of the scale; < 0: none) is drawn as a dashed line, e.g. the 0.8 utilisation mark. */
static void page_bars(bytebuf *b, const char *id, const char *title, int n, const char *const *labels,
                      const double *values, const char *const *texts, double scale, double rule)
{
    const int w = 420, row = 22, lab = 90, txt = 80, top = 22;
    int h = top + n * row + 6;
    double max = scale;
    for (int i = 0; i < n; i++) max = TM_MAX(max, values[i]);
    if (max <= 0) max = 1;
    bytebuf_printf(b, "<svg class=\"chart\" data-chart=\"%s\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                      "xmlns=\"http://www.w3.org/2000/svg\" role=\"img\"><title>", id, w, h, w, h);
    status_html_esc(b, title);
    bytebuf_printf(b, "</title><text x=\"0\" y=\"14\" class=\"ct\">");
    status_html_esc(b, title);
    bytebuf_puts(b, "</text>");
    int span = w - lab - txt;
    bytebuf_printf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"axis\"/>", lab, top - 2, lab, h - 4);
    for (int i = 0; i < n; i++) {
        int y = top + i * row;
        int bw = TM_MAX(1, (int)lround(span * TM_MAX(0.0, values[i]) / max));
        bytebuf_printf(b, "<text x=\"%d\" y=\"%d\" class=\"cl\" text-anchor=\"end\">%s</text>", lab - 6, y + 14, labels[i]);
        bytebuf_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" class=\"bar\"/>", lab, y + 3, bw, row - 6);
        bytebuf_printf(b, "<text x=\"%d\" y=\"%d\" class=\"cv\">%s</text>", lab + bw + 6, y + 14, texts[i]);
    }
    if (rule >= 0) {
        int x = lab + (int)lround(span * rule * scale / max);
        bytebuf_printf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"rule\"/>", x, top - 2, x, h - 4);
    }
    bytebuf_puts(b, "</svg>");
}

/* A column chart of per-minute values, oldest left. */
static void page_columns(bytebuf *b, const char *id, const char *title, int n, const uint64_t *v)
{
    const int w = 420, h = 130, top = 22, bottom = 16;
    uint64_t max = 1;
    for (int i = 0; i < n; i++) max = TM_MAX(max, v[i]);
    bytebuf_printf(b, "<svg class=\"chart\" data-chart=\"%s\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                      "xmlns=\"http://www.w3.org/2000/svg\" role=\"img\"><title>", id, w, h, w, h);
    status_html_esc(b, title);
    bytebuf_puts(b, "</title><text x=\"0\" y=\"14\" class=\"ct\">");
    status_html_esc(b, title);
    bytebuf_printf(b, "</text><line x1=\"0\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"axis\"/>", h - bottom, w, h - bottom);
    double cw = (double)w / n;
    int ph = h - top - bottom;
    for (int i = 0; i < n; i++) {
        int bh = TM_MAX(1, (int)lround((double)ph * (double)v[i] / (double)max));
        bytebuf_printf(b, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" class=\"bar\"><title>%llu</title></rect>",
                       i * cw + 0.5, h - bottom - bh, cw - 1, bh, (unsigned long long)v[i]);
    }
    bytebuf_printf(b, "<text x=\"0\" y=\"%d\" class=\"cl\">-%d min</text><text x=\"%d\" y=\"%d\" class=\"cl\" "
                      "text-anchor=\"end\">now (max %llu)</text></svg>", h - 2, n, w, h - 2, (unsigned long long)max);
}

void status_svg_line(bytebuf *b, const char *id, const char *title, const char *x_label, const char *y_label, int n,
                     const double *x, const double *y)
{
    const int w = 420, h = 220, left = 56, right = 14, top = 24, bottom = 40;
    double max = 0;
    for (int i = 0; i < n; i++) max = TM_MAX(max, y[i]);
    if (max <= 0) max = 1;
    int pw = w - left - right, ph = h - top - bottom;
    bytebuf_printf(b, "<svg class=\"chart\" data-chart=\"%s\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                      "xmlns=\"http://www.w3.org/2000/svg\" font-family=\"sans-serif\" role=\"img\"><title>", id, w, h, w, h);
    status_html_esc(b, title);
    bytebuf_puts(b, "</title><text x=\"0\" y=\"14\" font-size=\"12\" font-weight=\"600\">");
    status_html_esc(b, title);
    bytebuf_printf(b, "</text><line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#999\"/>"
                      "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#999\"/>",
                   left, top, left, top + ph, left, top + ph, left + pw, top + ph);
    bytebuf_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"end\">%.4g</text>"
                      "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"end\">0</text>",
                   left - 4, top + 8, max, left - 4, top + ph);
    bytebuf_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">", left + pw / 2, h - 4);
    status_html_esc(b, x_label);
    bytebuf_printf(b, "</text><text x=\"12\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\" transform=\"rotate(-90 12 %d)\">",
                   top + ph / 2, top + ph / 2);
    status_html_esc(b, y_label);
    bytebuf_puts(b, "</text><polyline fill=\"none\" stroke=\"#3b7dd8\" stroke-width=\"2\" points=\"");
    double dx = n > 1 ? (double)pw / (n - 1) : 0;
    for (int i = 0; i < n; i++)
        bytebuf_printf(b, "%s%.1f,%.1f", i ? " " : "", left + (n > 1 ? i * dx : pw / 2.0), top + ph - ph * TM_MAX(0.0, y[i]) / max);
    bytebuf_puts(b, "\"/>");
    for (int i = 0; i < n; i++) {
        double cx = left + (n > 1 ? i * dx : pw / 2.0), cy = top + ph - ph * TM_MAX(0.0, y[i]) / max;
        bytebuf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#3b7dd8\"><title>%g: %.4g</title></circle>"
                          "<text x=\"%.1f\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\">%g</text>",
                       cx, cy, x[i], y[i], cx, top + ph + 13, x[i]);
    }
    bytebuf_puts(b, "</svg>");
}

static void page_section(bytebuf *b, const char *id, const char *question, const char *why)
{
    bytebuf_printf(b, "<section id=\"%s\"><h2>%s</h2><p class=\"why\">%s</p>", id, question, why);
}

static const char status_css[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}"
    "h1{font-size:20px;margin:0 0 .2em}h2{font-size:16px;margin:.2em 0}"
    "section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.8em 1em;margin:.8em 0}"
    ".why{color:#555;margin:.2em 0 .6em}.figs{display:flex;flex-wrap:wrap;gap:1.2em}"
    ".fig .v{font-size:18px;font-weight:600;display:block}.fig .l{color:#666;font-size:12px}"
    "table{border-collapse:collapse;margin:.4em 0}td,th{border-bottom:1px solid #eee;padding:2px 10px;text-align:right}"
    "th:first-child,td:first-child{text-align:left}svg.chart{display:block;margin:.4em 0}"
    ".bar{fill:#3b7dd8}.axis{stroke:#999}.rule{stroke:#d33;stroke-dasharray:4 3}"
    ".ct{font-size:12px;font-weight:600;fill:#333}.cl,.cv{font-size:11px;fill:#444}";

/* What status_page's sections share: the request windows, the retention classes and one
 * chart's rows (labels, values, texts; lab holds the window names every window chart uses). */
typedef struct {
    status_ring *st;
    const status_page_in *in;
    const sched_stats *ss;                 /* NULL on the gateway */
    const gc_retention *ret;
    status_window win[STATUS_WINDOWS];
    char lab[STATUS_WINDOWS][32], txt[8][48];
    const char *labels[8], *texts[8];
    double vals[8];
} page_ctx;

/* The head, the clock and, when several models are served, the links to each one's page. */
static void page_head(bytebuf *b, const status_page_in *in)
{
    char tbuf[64];
    time_t tnow = (time_t)in->now;
    struct tm tm;
    gmtime_r(&tnow, &tm);
    strftime(tbuf, sizeof tbuf, "%Y-%m-%d %H:%M:%S UTC", &tm);

    bytebuf_puts(b, "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
                    "<meta http-equiv=\"refresh\" content=\"10\"><title>tokenmill: ");
    status_html_esc(b, in->model_name);
    bytebuf_printf(b, "</title><style>%s</style></head><body><h1>tokenmill: ", status_css);
    status_html_esc(b, in->model_name);
    bytebuf_printf(b, "</h1><p class=\"why\">%s; up ", tbuf);
    page_duration(b, TM_MAX(0.0, in->now - in->started));
    bytebuf_puts(b, ". This page refreshes every 10 s; windows are the last 5 minutes, hour and day.</p>");
    if (in->n_models > 1) {   /* one page per model: its scheduler, its requests */
        bytebuf_puts(b, "<p class=\"why\">This server serves several models, each with its own scheduler and KV pool; "
                        "this page is one model's. Models:");
        for (int i = 0; i < in->n_models; i++) {
            bytebuf_puts(b, i ? ", " : " ");
            bytebuf_puts(b, "<a href=\"/status?model=");
            for (const unsigned char *p = (const unsigned char *)in->model_names[i]; *p; p++) {
                if ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || strchr("-._~", *p))
                    bytebuf_putc(b, (char)*p);
                else bytebuf_printf(b, "%%%02X", *p);
            }
            bytebuf_puts(b, "\">");
            status_html_esc(b, in->model_names[i]);
            bytebuf_puts(b, "</a>");
        }
        bytebuf_puts(b, ".</p>");
    }
}

/* The counters /metrics exports, side by side. */
static void page_totals(bytebuf *b, const sched_stats *ss)
{
    bytebuf_puts(b, "<section id=\"totals\"><h2>Since start</h2><div class=\"figs\">");
    page_metric(b, "requests", "tokenmill_requests_total", (double)ss->n_requests);
    page_metric(b, "prompt tokens", "tokenmill_prompt_tokens_total", (double)ss->n_prompt_tokens);
    page_metric(b, "cached prompt tokens", "tokenmill_cached_prompt_tokens_total", (double)ss->n_cached_tokens);
    page_metric(b, "generated tokens", "tokenmill_generated_tokens_total", (double)ss->n_gen_tokens);
    page_metric(b, "running", "tokenmill_running_sequences", ss->n_running);
    page_metric(b, "queued", "tokenmill_queue_depth", ss->n_queued);
    bytebuf_puts(b, "</div></section>");
}

/* 1. Where the cache sits: the store, its fill, the RAM tier and the window cache. */
static void page_cache(bytebuf *b, page_ctx *c)
{
    const status_page_in *in = c->in;
    const sched_stats *ss = c->ss;
    page_section(b, "cache", "1. Where does the cache sit?",
                 "Prompt prefixes are kept as KV blocks: in RAM on this machine first, then in the block store "
                 "below, which every process given the same spec shares.");
    bytebuf_puts(b, "<div class=\"figs\">");
    bytebuf_puts(b, "<div class=\"fig\"><span class=\"v\">");
    status_html_esc(b, in->store_spec ? in->store_spec : "none (RAM only)");
    bytebuf_puts(b, "</span><span class=\"l\">block store</span></div><div class=\"fig\"><span class=\"v\">");
    page_bytes(b, in->store_bytes);
    bytebuf_puts(b, "</span><span class=\"l\">held</span></div><div class=\"fig\"><span class=\"v\">");
    if (in->store_capacity) page_bytes(b, in->store_capacity);
    else bytebuf_puts(b, "unlimited");
    bytebuf_puts(b, "</span><span class=\"l\">capacity per target</span></div>");
    if (ss) {
        page_metric(b, "KV blocks cached in RAM", "tokenmill_kv_blocks_cached", ss->kv_blocks_cached);
        page_metric(b, "KV blocks in RAM", "tokenmill_kv_blocks_total", ss->kv_blocks_total);
        if (ss->window) {   /* sliding-window models: the window cache */
            page_metric(b, "window states held", "tokenmill_window_entries", (double)ss->window_entries);
            page_metric(b, "window hits", "tokenmill_window_hits_total", (double)ss->window_hits);
            page_metric(b, "window replays (bounded)", "tokenmill_window_replays_bounded_total", (double)ss->window_replay_bounded);
            page_metric(b, "window replays (exact)", "tokenmill_window_replays_exact_total", (double)ss->window_replay_exact);
        }
    }
    bytebuf_puts(b, "</div>");
    if (in->store_spec) {
        double fill = in->store_capacity ? (double)in->store_bytes / (double)in->store_capacity : 0;
        if (in->store_capacity) snprintf(c->txt[0], sizeof c->txt[0], "%.1f %%", 100 * fill);
        else snprintf(c->txt[0], sizeof c->txt[0], "no capacity set");
        c->labels[0] = "store";
        c->texts[0] = c->txt[0];
        c->vals[0] = fill;
        page_bars(b, "store_fill", "Block store fill (of capacity)", 1, c->labels, c->vals, c->texts, 1.0, -1);
    }
    bytebuf_puts(b, "</section>");
}

/* 2. Retention: each class's TTL, the oldest block, what expired and what was evicted. */
static void page_retention(bytebuf *b, const page_ctx *c)
{
    const status_page_in *in = c->in;
    const gc_retention *ret = c->ret;
    page_section(b, "retention", "2. How long are entries kept?",
                 "Each traffic class keeps its blocks this long after their last use; past the capacity the "
                 "least recently used go first.");
    bytebuf_puts(b, "<table><tr><th>traffic class</th><th>TTL after last use</th></tr>");
    for (int k = 0; k < ret->n; k++) {
        bytebuf_puts(b, "<tr><td>");
        status_html_esc(b, ret->name[k]);
        bytebuf_puts(b, k ? "" : " (default)");
        bytebuf_puts(b, "</td><td>");
        page_duration(b, ret->ttl_s[k]);
        bytebuf_puts(b, "</td></tr>");
    }
    bytebuf_puts(b, "</table><div class=\"figs\"><div class=\"fig\"><span class=\"v\" data-oldest>");
    if (in->store_oldest > 0) page_duration(b, TM_MAX(0.0, in->now - in->store_oldest));
    else bytebuf_puts(b, "–");
    bytebuf_printf(b, "</span><span class=\"l\">since the oldest block's last use</span></div>"
                      "<div class=\"fig\"><span class=\"v\">%llu</span><span class=\"l\">"
                      "blocks expired (TTL)</span></div><div class=\"fig\"><span class=\"v\">%llu</span><span "
                      "class=\"l\">blocks evicted (capacity)</span></div></div></section>",
                   (unsigned long long)in->store_expired, (unsigned long long)in->store_evicted);
}

/* 3. Measurement: the share of input tokens served from cache, by class and for the viewer's key. */
static void page_hits(bytebuf *b, page_ctx *c)
{
    const status_page_in *in = c->in;
    const gc_retention *ret = c->ret;
    const status_window *win = c->win;
    page_section(b, "hits", "3. Does every response report its cache hits?",
                 "Yes: each response's usage carries its cached input tokens (OpenAI prompt_tokens_details."
                 "cached_tokens, Anthropic cache_read_input_tokens); these are their sums, as the share of input "
                 "tokens served from cache.");
    bytebuf_puts(b, "<table><tr><th>traffic class</th>");
    for (int k = 0; k < STATUS_WINDOWS; k++) bytebuf_printf(b, "<th>%s</th>", status_window_names[k]);
    bytebuf_puts(b, "</tr>");
    for (int cl = -1; cl < ret->n; cl++) {   /* -1: all classes */
        bytebuf_puts(b, "<tr><td>");
        if (cl < 0) bytebuf_puts(b, "all");
        else status_html_esc(b, ret->name[cl]);
        bytebuf_puts(b, "</td>");
        for (int k = 0; k < STATUS_WINDOWS; k++) {
            uint64_t p = 0, h = 0, n = 0;
            for (int cc = 0; cc < GC_MAX_CLASSES; cc++)
                if (cl < 0 || cc == cl) {
                    p += win[k].n_prompt[cc];
                    h += win[k].n_cached[cc];
                    n += win[k].n_req[cc];
                }
            bytebuf_printf(b, "<td data-window=\"%d\" data-class=\"%s\" data-cached=\"%llu\" data-prompt=\"%llu\">",
                           status_window_minutes[k], cl < 0 ? "*" : ret->name[cl], (unsigned long long)h,
                           (unsigned long long)p);
            page_share(b, (double)h, (double)p);
            bytebuf_printf(b, " <small>(%llu req)</small></td>", (unsigned long long)n);
            if (cl < 0) {
                c->vals[k] = p ? (double)h / (double)p : 0;
                snprintf(c->txt[k], sizeof c->txt[k], p ? "%.1f %%" : "–", 100 * c->vals[k]);
                c->labels[k] = c->lab[k];
                c->texts[k] = c->txt[k];
            }
        }
        bytebuf_puts(b, "</tr>");
    }
    if (in->viewer_slot > 0 && in->viewer_slot <= STATUS_MAX_KEYS) {   /* this key's own, no other's */
        int vk = in->viewer_slot - 1;
        bytebuf_puts(b, "<tr><td>your API key</td>");
        for (int k = 0; k < STATUS_WINDOWS; k++) {
            uint64_t p = win[k].key_prompt[vk], h = win[k].key_cached[vk];
            bytebuf_printf(b, "<td data-window=\"%d\" data-key-cached=\"%llu\" data-key-prompt=\"%llu\">",
                           status_window_minutes[k], (unsigned long long)h, (unsigned long long)p);
            page_share(b, (double)h, (double)p);
            bytebuf_puts(b, "</td>");
        }
        bytebuf_puts(b, "</tr>");
    }
    bytebuf_puts(b, "</table>");
    page_bars(b, "hits", "Input tokens served from cache", STATUS_WINDOWS, c->labels, c->vals, c->texts, 1.0, -1);
    bytebuf_puts(b, "</section>");
}

/* 4. Division of labour (the cluster's own lines) and time to first token by input length. */
static void page_labour(bytebuf *b, page_ctx *c)
{
    const status_page_in *in = c->in;
    const status_window *win = c->win;
    page_section(b, "labour", "4. Are prefill and decode separate? What does time to first token look like?",
                 in->role_text ? in->role_text : "");
    if (in->cluster) in->cluster(in->cluster_ud, b);
    bytebuf_puts(b, "<table><tr><th>input tokens</th>");
    for (int k = 0; k < STATUS_WINDOWS; k++) bytebuf_printf(b, "<th>%s mean / P99</th>", status_window_names[k]);
    bytebuf_puts(b, "</tr>");
    for (int l = 0; l < STATUS_LEN_N; l++) {
        bytebuf_printf(b, "<tr><td>%s</td>", status_len_names[l]);
        for (int k = 0; k < STATUS_WINDOWS; k++) {
            uint64_t n = 0;
            for (int i = 0; i <= SCHED_HIST_N; i++) n += win[k].ttft[l][i];
            double p99 = status_quantile(win[k].ttft[l], sched_hist_bounds, SCHED_HIST_N, 0.99);
            bytebuf_printf(b, "<td data-window=\"%d\" data-len=\"%d\" data-n=\"%llu\" data-p99=\"%.6g\">",
                           status_window_minutes[k], l, (unsigned long long)n, p99);
            page_secs(b, n ? win[k].ttft_sum[l] / (double)n : -1);
            bytebuf_puts(b, " / ");
            page_secs(b, p99);
            bytebuf_printf(b, " <small>(%llu)</small></td>", (unsigned long long)n);
        }
        bytebuf_puts(b, "</tr>");
    }
    bytebuf_puts(b, "</table>");
    for (int k = 0; k < STATUS_WINDOWS; k++) {
        uint64_t all[SCHED_HIST_N + 1] = { 0 };
        for (int l = 0; l < STATUS_LEN_N; l++)
            for (int i = 0; i <= SCHED_HIST_N; i++) all[i] += win[k].ttft[l][i];
        double p99 = status_quantile(all, sched_hist_bounds, SCHED_HIST_N, 0.99);
        c->vals[k] = TM_MAX(0.0, p99);
        c->texts[k] = page_fmt_secs(c->txt[k], sizeof c->txt[k], p99);
        c->labels[k] = c->lab[k];
    }
    page_bars(b, "ttft", "P99 time to first token, all inputs", STATUS_WINDOWS, c->labels, c->vals, c->texts, 0, -1);
    bytebuf_puts(b, "</section>");
}

/* 5. Speed: streams at once, each user's tokens/s, the machine's, and the measured curve. */
static void page_speed_section(bytebuf *b, const page_ctx *c)
{
    const status_page_in *in = c->in;
    const sched_stats *ss = c->ss;
    const status_window *win = c->win;
    page_section(b, "speed", "5. How many users share the machine, at what speed each?",
                 "Streams decoding at once, each user's tokens/s after the first token (median and the slowest "
                 "tenth), and the machine's generated tokens/s.");
    bytebuf_puts(b, "<div class=\"figs\">");
    if (ss) page_metric(b, "concurrent streams now", "tokenmill_running_sequences", ss->n_running);
    bytebuf_puts(b, "</div><table><tr><th></th>");
    for (int k = 0; k < STATUS_WINDOWS; k++) bytebuf_printf(b, "<th>%s</th>", status_window_names[k]);
    bytebuf_puts(b, "</tr><tr><td>per user, median tokens/s</td>");
    for (int k = 0; k < STATUS_WINDOWS; k++) {
        page_speed(b, status_quantile(win[k].speed, status_speed_bounds, STATUS_SPEED_N, 0.5));
    }
    bytebuf_puts(b, "</tr><tr><td>per user, slowest decile tokens/s</td>");
    for (int k = 0; k < STATUS_WINDOWS; k++) {
        page_speed(b, status_quantile(win[k].speed, status_speed_bounds, STATUS_SPEED_N, 0.1));
    }
    bytebuf_puts(b, "</tr><tr><td>machine, generated tokens/s</td>");
    for (int k = 0; k < STATUS_WINDOWS; k++)
        bytebuf_printf(b, "<td data-window=\"%d\" data-gen=\"%llu\">%.1f</td>", status_window_minutes[k],
                       (unsigned long long)win[k].n_gen, win[k].span_s > 0 ? (double)win[k].n_gen / win[k].span_s : 0);
    bytebuf_puts(b, "</tr></table>");
    uint64_t per_min[60];
    status_minutes_gen(c->st, in->now, 60, per_min);
    page_columns(b, "gen_per_minute", "Generated tokens per minute, last hour", 60, per_min);
    if (in->curve && in->curve->n) {
        int now_streams = ss ? ss->n_running : 0;
        bytebuf_printf(b, "<p data-curve-at=\"%d\">On this machine's measured decode curve (<code>tokenmill bench curves</code>), "
                          "%d concurrent stream%s get %.1f tokens/s each.</p>", now_streams, now_streams,
                       now_streams == 1 ? "" : "s", status_curve_user_at(in->curve, TM_MAX(1, now_streams)));
        status_svg_line(b, "decode_curve", "Measured: tokens/s per user against concurrent streams", "concurrent streams",
                        "tokens/s per user", in->curve->n, in->curve->streams, in->curve->user_tok_s);
    }
    bytebuf_puts(b, "</section>");
}

/* 6. Spare capacity: utilisation against the 0.8 rule and the advice drawn from it. */
static void page_capacity(bytebuf *b, page_ctx *c)
{
    const sched_stats *ss = c->ss;
    const status_window *win = c->win;
    page_section(b, "capacity", "6. How much capacity is spare?",
                 "Utilisation is the share of time the engine was computing. The 0.8 rule: past 80 % busy, "
                 "queueing delay (and so time to first token) grows steeply; add capacity before it.");
    for (int k = 0; k < STATUS_WINDOWS; k++) {
        c->vals[k] = TM_MAX(0.0, win[k].busy);
        if (win[k].busy < 0) snprintf(c->txt[k], sizeof c->txt[k], "not sampled yet");
        else snprintf(c->txt[k], sizeof c->txt[k], "%.1f %%", 100 * win[k].busy);
        c->texts[k] = c->txt[k];
        c->labels[k] = c->lab[k];
    }
    if (ss) {
        bytebuf_puts(b, "<div class=\"figs\">");
        page_metric(b, "queued now", "tokenmill_queue_depth", ss->n_queued);
        page_metric(b, "KV blocks free", "tokenmill_kv_blocks_free", ss->kv_blocks_free);
        page_metric(b, "refused (queue full)", "tokenmill_requests_rejected_total", (double)ss->n_rejected);
        bytebuf_puts(b, "</div>");
        page_bars(b, "utilisation", "Engine utilisation (dashed: the 0.8 rule)", STATUS_WINDOWS, c->labels, c->vals,
                  c->texts, 1.0, 0.8);
        double u = win[0].busy;
        bytebuf_puts(b, "<p class=\"advice\"><b>Advice:</b> ");
        if (u < 0) bytebuf_puts(b, "not enough samples yet (the page and /metrics sample the engine).");
        else if (u > 0.8) bytebuf_puts(b, "over 80 % busy in the last 5 minutes: add a machine.");
        else bytebuf_printf(b, "%.0f %% of the engine's time is spare in the last 5 minutes.", 100 * (1 - u));
        bytebuf_puts(b, "</p>");
    } else {
        bytebuf_puts(b, "<p class=\"why\">The cluster's capacity advice and resumed requests are in answer 4.</p>");
    }
    bytebuf_puts(b, "</section>");
}

/* Cost per million tokens of each kind over the last hour's busy time (only with a price). */
static void page_cost(bytebuf *b, const page_ctx *c)
{
    const status_page_in *in = c->in;
    const status_window *w = &c->win[1];
    double secs = w->busy >= 0 ? w->busy_s : w->span_s;  /* no engine here (the gateway): wall time */
    uint64_t p = 0, h = 0;
    for (int k = 0; k < GC_MAX_CLASSES; k++) {
        p += w->n_prompt[k];
        h += w->n_cached[k];
    }
    double kinds[3] = { (double)(p - h), (double)h, (double)w->n_gen };
    const char *names[3] = { "input, uncached", "input, cached", "output" };
    page_section(b, "cost", "Cost per million tokens",
                 "The machine's price for the busy time of the last hour, over the tokens of each kind moved "
                 "in it (each kind as if it alone had used that time: an upper bound per kind).");
    bytebuf_printf(b, "<p>Price: %.4g per hour; busy time: ", in->cost_per_hour);
    page_duration(b, secs);
    bytebuf_puts(b, "</p><table><tr><th>tokens</th><th>count</th><th>cost per million</th></tr>");
    for (int i = 0; i < 3; i++) {
        bytebuf_printf(b, "<tr><td>%s</td><td>%.0f</td><td>", names[i], kinds[i]);
        if (kinds[i] > 0 && secs > 0) bytebuf_printf(b, "%.4g", in->cost_per_hour * secs / 3600 / kinds[i] * 1e6);
        else bytebuf_puts(b, "–");
        bytebuf_puts(b, "</td></tr>");
    }
    bytebuf_puts(b, "</table></section>");
}

void status_page(status_ring *st, const status_page_in *in, bytebuf *b)
{
    page_ctx ctx = { .st = st }, *c = &ctx;
    c->in = in;
    c->ss = in->sched;
    for (int k = 0; k < STATUS_WINDOWS; k++) {
        status_window_get(st, in->now, status_window_minutes[k], &c->win[k]);
        snprintf(c->lab[k], sizeof c->lab[k], "%s", status_window_names[k]);
    }
    gc_retention def;
    if (!in->retention) gc_retention_default(&def);
    c->ret = in->retention ? in->retention : &def;

    page_head(b, in);
    if (c->ss) page_totals(b, c->ss);
    page_cache(b, c);
    page_retention(b, c);
    page_hits(b, c);
    page_labour(b, c);
    page_speed_section(b, c);
    page_capacity(b, c);
    if (in->cost_per_hour > 0) page_cost(b, c);
    bytebuf_puts(b, "</body></html>\n");
}
