/*
 * ep: expert parallelism, the leader's group and the members' service (see ep.h). The EPLB
 * functions are a port of eplb.py's rebalance_experts for one layer (balanced_packing,
 * replicate_experts, the hierarchical composition), with ties broken to the lower index.
 */
#include "cluster/ep.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster/proto.h"
#include "util/util.h"

#define EP_FRAME_FLOATS (4u << 20)  /* rows per EXPERTS frame up to this many floats (16 MiB) */
#define EP_RECONNECT_S 2.0          /* a down member is tried again this often */
#define EP_CONNECT_MS 3000          /* TCP connect timeout */
#define EP_MEMBER_CONNS 8           /* leaders a member serves at once */

/* ---- EPLB ---------------------------------------------------------------------------- */

/* Indices 0..n-1 by w descending, ties by index (a stable sort). */
static void ep_order_desc(const double *w, int n, int32_t *idx)
{
    for (int i = 0; i < n; i++) idx[i] = i;
    for (int i = 1; i < n; i++) {   /* insertion sort: n is an expert count */
        int32_t v = idx[i];
        int j = i - 1;
        while (j >= 0 && w[idx[j]] < w[v]) {
            idx[j + 1] = idx[j];
            j--;
        }
        idx[j + 1] = v;
    }
}

/* balanced_packing: n items of weight w into n_packs packs of n / n_packs items each, the
 * heaviest first, each into the lightest pack that has room. pack, rank: (n). */
static void ep_pack(const double *w, int n, int n_packs, int32_t *pack, int32_t *rank)
{
    int per = n / n_packs;
    if (per == 1) {
        for (int i = 0; i < n; i++) { pack[i] = i; rank[i] = 0; }
        return;
    }
    int32_t *idx = xmalloc((size_t)n * sizeof *idx);
    double *pw = xcalloc((size_t)n_packs, sizeof *pw);
    int *pn = xcalloc((size_t)n_packs, sizeof *pn);
    ep_order_desc(w, n, idx);
    for (int i = 0; i < n; i++) {
        int best = -1;
        for (int p = 0; p < n_packs; p++)
            if (pn[p] < per && (best < 0 || pw[p] < pw[best])) best = p;
        pack[idx[i]] = best;
        rank[idx[i]] = pn[best]++;
        pw[best] += w[idx[i]];
    }
    free(idx);
    free(pw);
    free(pn);
}

/* replicate_experts: n_phys slots for n_log experts, each extra slot to the expert with the
 * most load per replica. phy2log, phyrank (n_phys), cnt (n_log). */
static void ep_replicate(const double *w, int n_log, int n_phys, int32_t *phy2log, int32_t *phyrank, int32_t *cnt)
{
    for (int i = 0; i < n_log; i++) { phy2log[i] = i; phyrank[i] = 0; cnt[i] = 1; }
    for (int s = n_log; s < n_phys; s++) {
        int best = 0;
        for (int i = 1; i < n_log; i++)
            if (w[i] / cnt[i] > w[best] / cnt[best]) best = i;
        phy2log[s] = best;
        phyrank[s] = cnt[best]++;
    }
}

bool ep_eplb(const double *load, int n_log, int n_phys, int n_groups, int n_nodes, int n_gpus, int32_t *phys2log,
             int32_t *logcnt)
{
    if (n_log < 1 || n_phys < n_log || n_gpus < 1 || n_nodes < 1 || n_groups < 1 || n_gpus % n_nodes ||
        n_phys % n_gpus || n_log % n_groups)
        return false;
    if (n_groups % n_nodes) n_groups = n_nodes = 1;   /* the global policy */
    const int gsize = n_log / n_groups, g_per_node = n_groups / n_nodes, per_gpu = n_phys / n_gpus;
    const int mlog_per_node = n_log / n_nodes, phy_per_node = n_phys / n_nodes, gpus_per_node = n_gpus / n_nodes;
    int32_t *gpack = xmalloc((size_t)n_groups * sizeof *gpack), *grank = xmalloc((size_t)n_groups * sizeof *grank);
    int32_t *log2mlog = xmalloc((size_t)n_log * sizeof *log2mlog), *mlog2log = xmalloc((size_t)n_log * sizeof *mlog2log);
    double *gw = xcalloc((size_t)n_groups, sizeof *gw), *mw = xmalloc((size_t)n_log * sizeof *mw);
    int32_t *phy2mlog = xmalloc((size_t)n_phys * sizeof *phy2mlog), *phyrank = xmalloc((size_t)n_phys * sizeof *phyrank);
    int32_t *mcnt = xmalloc((size_t)n_log * sizeof *mcnt);
    double *pw = xmalloc((size_t)phy_per_node * sizeof *pw);
    int32_t *ppack = xmalloc((size_t)phy_per_node * sizeof *ppack), *prank = xmalloc((size_t)phy_per_node * sizeof *prank);
    /* 1: groups onto nodes */
    for (int x = 0; x < n_log; x++) gw[x / gsize] += load[x];
    ep_pack(gw, n_groups, n_nodes, gpack, grank);
    for (int x = 0; x < n_log; x++) {
        int g = x / gsize;
        log2mlog[x] = (gpack[g] * g_per_node + grank[g]) * gsize + x % gsize;
    }
    for (int x = 0; x < n_log; x++) mlog2log[log2mlog[x]] = x;
    for (int i = 0; i < n_log; i++) mw[i] = load[mlog2log[i]];
    for (int nd = 0; nd < n_nodes; nd++) {
        /* 2: replicas within the node */
        const double *w = mw + (size_t)nd * mlog_per_node;
        int32_t *p2m = phy2mlog + (size_t)nd * phy_per_node, *pr = phyrank + (size_t)nd * phy_per_node;
        int32_t *cnt = mcnt + (size_t)nd * mlog_per_node;
        ep_replicate(w, mlog_per_node, phy_per_node, p2m, pr, cnt);
        /* 3: the node's slots onto its processes */
        for (int s = 0; s < phy_per_node; s++) pw[s] = w[p2m[s]] / cnt[p2m[s]];
        ep_pack(pw, phy_per_node, gpus_per_node, ppack, prank);
        for (int s = 0; s < phy_per_node; s++) {
            int pp = ppack[s] * per_gpu + prank[s];   /* phy2pphy */
            phys2log[(size_t)nd * phy_per_node + pp] = mlog2log[nd * mlog_per_node + p2m[s]];
        }
    }
    for (int x = 0; x < n_log; x++) logcnt[x] = mcnt[log2mlog[x]];
    free(gpack); free(grank); free(log2mlog); free(mlog2log); free(gw); free(mw);
    free(phy2mlog); free(phyrank); free(mcnt); free(pw); free(ppack); free(prank);
    return true;
}

void ep_eplb_holders(const int32_t *phys2log, int n_phys, int n_procs, int n_log, uint64_t *holders)
{
    memset(holders, 0, (size_t)n_log * sizeof *holders);
    for (int s = 0; s < n_phys; s++) holders[phys2log[s]] |= 1ull << (s / (n_phys / n_procs));
}

double ep_placement_imbalance(const double *load, int n_log, const uint64_t *holders, int n_procs)
{
    double pl[EP_MAX_MEMBERS + 1] = { 0 }, all = 0, max = 0;
    for (int x = 0; x < n_log; x++) {
        int n = __builtin_popcountll(holders[x]);
        if (!n) continue;
        for (int p = 0; p < n_procs; p++)
            if (holders[x] >> p & 1) pl[p] += load[x] / n;
        all += load[x];
    }
    if (all <= 0) return 0;
    for (int p = 0; p < n_procs; p++) max = pl[p] > max ? pl[p] : max;
    return max / (all / n_procs);
}

/* ---- the leader's group ------------------------------------------------------------------ */

typedef struct {
    char addr[256];
    proto_conn pc;               /* fd -1 while down */
    bool up;
    int pending_fd;              /* a reconnected, greeted socket for the step thread (under mu) */
    proto_conn pending_pc;
    /* this layer's exchange (step thread) */
    int n_exp;                   /* experts sent */
    int32_t *exp;                /* (E) their ids, ascending */
    int32_t *rows;               /* (E) their row counts */
    int n_frames;
    int32_t *frame0;             /* (E + 1) first expert of each frame */
    int n_mb;                    /* micro-batches of the exchange: 1, or 2 with overlap */
    int mb_frame[3];             /* frames [mb_frame[m], mb_frame[m + 1]) carry micro-batch m */
    float *gbuf;                 /* gathered rows of one frame */
    size_t gcap;                 /* floats */
    bytebuf buf;                 /* encoded frame */
    /* counters (under mu for readers) */
    uint64_t rows_out;           /* rows computed by this member */
    uint64_t bytes_out, bytes_in;
    uint64_t failures;           /* times it went down */
    char why[160];               /* the last failure */
} ep_link;

struct ep_group {
    engine *e;
    const model *m;
    int n_procs, n_members;      /* members + 1 (the leader is process 0) */
    int E, n_layers, dim, first_moe, last_moe;
    int redundant;
    int micro_batches;           /* per member and layer: 2 (overlap) or 1 */
    double timeout_s, rebalance_s;
    auth_key key;
    engine_ep_hooks hooks;
    ep_link *links;              /* (n_members) */
    pthread_mutex_t mu;          /* links' pending_fd and counters, the placement pointer */
    pthread_cond_t cv;
    pthread_t thr;               /* reconnects down members */
    bool thr_started, stop;
    bool *want;                  /* (n_members) down: the thread reconnects it (under mu) */
    uint64_t *holders;           /* (n_layers, E) current placement */
    uint64_t *holders_next;      /* the one being built */
    double next_rebalance;       /* util_now() of the next EPLB placement */
    uint64_t n_rebalances;
    /* the step thread's per-layer state */
    const int32_t *off;          /* the engine's x_off of this layer */
    int32_t *tmp;                /* (E) */
    int64_t assigned[EP_MAX_MEMBERS + 1];
    double t0, t_sent;
    double step_exch_s, step_wait_s; /* this step's share of exch_s, wait_s (the step log) */
    int step_n;                  /* this step's exchanges */
    /* counters */
    uint64_t rows_local, n_exchanges;
    uint64_t n_split;            /* member exchanges sent as two micro-batches */
    double exch_s, wait_s;       /* dispatch start to replies in; blocked in combine */
};

/* The flags of frame f of an exchange of n_frames frames in n_mb micro-batches (mb_frame as
 * ep_link's): LAST ends a micro-batch, MORE with it says a second one follows. Both sides'. */
static uint32_t ep_frame_flags(int n_mb, const int *mb_frame, int n_frames, int f)
{
    if (n_mb == 2 && f == mb_frame[1] - 1) return PROTO_F_LAST | PROTO_F_MORE;
    return f == n_frames - 1 ? PROTO_F_LAST : 0;
}

static void ep_link_close(ep_link *l)
{
    if (l->pc.fd >= 0) close(l->pc.fd);
    proto_conn_free(&l->pc);
    l->pc.fd = -1;
    l->up = false;
}

/* Connects and greets: handshake under the deadline, HELLO both ways, the fingerprint and the
 * role checked. The socket in *pc, or -1 and why. */
static int ep_link_open(const char *addr, const auth_key *key, const model *m, int max_batch, proto_conn *pc,
                        char *why, size_t whysz)
{
    int fd = proto_connect(addr, EP_CONNECT_MS);
    if (fd < 0) {
        snprintf(why, whysz, "connect %s: %s", addr, strerror(errno));
        return -1;
    }
    proto_conn_init(pc, fd);
    pc->deadline = util_now() + 5.0;
    char w2[160];
    auth_status ast = auth_handshake(pc, key, AUTH_SIDE_GATEWAY, w2, sizeof w2);
    if (ast != AUTH_OK) {
        snprintf(why, whysz, "%s: handshake: %s", addr, w2);
        goto fail;
    }
    proto_msg h = { .hdr = { .type = PROTO_HELLO } };
    h.u.hello.role = PROTO_ROLE_EXPERT;
    memcpy(h.u.hello.model_fp, m->fingerprint, 32);
    h.u.hello.max_batch_tokens = (uint32_t)max_batch;
    h.u.hello.n_vocab = (uint32_t)m->hp.n_vocab;
    if (proto_send_msg(pc, &h) != PROTO_OK) {
        snprintf(why, whysz, "%s: send failed", addr);
        goto fail;
    }
    proto_msg r;
    proto_status st = proto_recv(pc, &r);
    if (st != PROTO_OK) {
        snprintf(why, whysz, "%s: no HELLO (%s)", addr, proto_status_name(st));
        goto fail;
    }
    if (r.hdr.type == PROTO_ERROR) {
        snprintf(why, whysz, "%s refused: %s", addr, r.u.error.msg ? r.u.error.msg : "?");
        proto_msg_free(&r);
        goto fail;
    }
    bool ok = r.hdr.type == PROTO_HELLO && r.u.hello.role == PROTO_ROLE_EXPERT;
    bool same = ok && !memcmp(r.u.hello.model_fp, m->fingerprint, 32);
    proto_msg_free(&r);
    if (!ok || !same) {
        snprintf(why, whysz, "%s: %s", addr, !ok ? "not an expert member (tokenmill expert)" : "another model (fingerprints differ)");
        goto fail;
    }
    pc->deadline = 0;
    return fd;
fail:
    close(fd);
    proto_conn_free(pc);
    return -1;
}

static void ep_link_down(ep_group *g, ep_link *l, const char *why)
{
    log_warn("ep: member %s is down (%s): its experts are computed here until it is back", l->addr, why);
    ep_link_close(l);
    pthread_mutex_lock(&g->mu);
    l->failures++;
    snprintf(l->why, sizeof l->why, "%s", why);
    g->want[l - g->links] = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void *ep_reconnect_main(void *arg)
{
    ep_group *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        int i = -1;
        for (int k = 0; k < g->n_members && i < 0; k++)
            if (g->want[k] && g->links[k].pending_fd < 0) i = k;
        if (i < 0) {
            util_cond_wait_ms(&g->cv, &g->mu, 1000);
            continue;
        }
        char addr[256], why[200];
        snprintf(addr, sizeof addr, "%s", g->links[i].addr);
        pthread_mutex_unlock(&g->mu);
        proto_conn pc;
        int fd = ep_link_open(addr, &g->key, g->m, engine_max_batch(g->e), &pc, why, sizeof why);
        pthread_mutex_lock(&g->mu);
        if (fd >= 0 && !g->stop) {
            g->links[i].pending_pc = pc;
            g->links[i].pending_fd = fd;
            g->want[i] = false;
        } else {
            if (fd >= 0) { close(fd); proto_conn_free(&pc); }
            util_cond_wait_ms(&g->cv, &g->mu, (int)(EP_RECONNECT_S * 1000));
        }
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* The contiguous placement: process p holds [E p / P, E (p + 1) / P). */
static void ep_contiguous(int E, int P, uint64_t *holders)
{
    for (int p = 0; p < P; p++)
        for (int x = (int)((int64_t)E * p / P); x < (int)((int64_t)E * (p + 1) / P); x++) holders[x] = 1ull << p;
}

/* An EPLB placement of every MoE layer from the engine's load window (uniform where nothing
 * was counted yet) into g->holders_next. The global policy, the group as one node of P
 * processes: the hierarchical one keeps an expert's copies on its own node, and each process
 * of the group is a machine of its own, so a copy would land beside its original and balance
 * nothing (test_ep's skewed load: 2.46 before and after). */
static void ep_place(ep_group *g)
{
    const int E = g->E, P = g->n_procs, n_phys = E + g->redundant;
    uint64_t *win = xmalloc((size_t)E * sizeof *win);
    double *load = xmalloc((size_t)E * sizeof *load);
    int32_t *p2l = xmalloc((size_t)n_phys * sizeof *p2l), *cnt = xmalloc((size_t)E * sizeof *cnt);
    for (int il = 0; il < g->n_layers; il++) {
        uint64_t *h = g->holders_next + (size_t)il * E;
        if (!g->m->layers[il].gate_exps.data) { ep_contiguous(E, P, h); continue; }
        double all = 0;
        if (engine_moe_load(g->e, il, win, NULL, NULL))
            for (int x = 0; x < E; x++) all += (double)win[x];
        for (int x = 0; x < E; x++) load[x] = all > 0 ? (double)win[x] : 1.0;
        if (g->redundant > 0 && ep_eplb(load, E, n_phys, 1, 1, P, p2l, cnt)) ep_eplb_holders(p2l, n_phys, P, E, h);
        else ep_contiguous(E, P, h);
    }
    free(win);
    free(load);
    free(p2l);
    free(cnt);
}

/* At a step's first MoE layer: reconnected members rejoin, and a due placement is swapped in. */
static void ep_step_start(ep_group *g)
{
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->n_members; i++) {
        ep_link *l = &g->links[i];
        if (l->pending_fd >= 0) {
            l->pc = l->pending_pc;
            l->pending_fd = -1;
            l->up = true;
            log_info("ep: member %s is back", l->addr);
        }
    }
    pthread_mutex_unlock(&g->mu);
    g->step_exch_s = g->step_wait_s = 0;
    g->step_n = 0;
    if (g->redundant > 0 && g->rebalance_s > 0 && util_now() >= g->next_rebalance) {
        ep_place(g);   /* beside the current one, which the metrics may be reading */
        pthread_mutex_lock(&g->mu);
        uint64_t *t = g->holders;
        g->holders = g->holders_next;
        g->holders_next = t;
        g->n_rebalances++;
        pthread_mutex_unlock(&g->mu);
        g->next_rebalance = util_now() + g->rebalance_s;
    }
}

static bool ep_send_frame(ep_group *g, ep_link *l, int il, int f, const float *xg)
{
    const int dim = g->dim;
    int a = l->frame0[f], b = l->frame0[f + 1];
    size_t n = 0;
    for (int i = a; i < b; i++) n += (size_t)l->rows[i] * dim;
    if (n > l->gcap) {
        free(l->gbuf);
        l->gbuf = xmalloc(n * sizeof(float));
        l->gcap = n;
    }
    size_t o = 0;
    for (int i = a; i < b; i++) {
        size_t k = (size_t)l->rows[i] * dim;
        memcpy(l->gbuf + o, xg + (size_t)g->off[l->exp[i]] * dim, k * sizeof(float));
        o += k;
    }
    proto_msg m = { .hdr = { .type = PROTO_EXPERTS, .flags = ep_frame_flags(l->n_mb, l->mb_frame, l->n_frames, f) } };
    m.u.experts = (proto_experts){ .layer = (uint16_t)il, .dim = (uint32_t)dim, .n_exp = (uint32_t)(b - a),
                                   .experts = l->exp + a, .n_rows = l->rows + a, .n_floats = (uint32_t)n, .x = l->gbuf };
    l->buf.len = 0;
    if (proto_encode(&l->buf, &m) != PROTO_OK) return false;
    if (proto_send_frame(&l->pc, l->buf.p, l->buf.len) != PROTO_OK) return false;
    l->bytes_out += l->buf.len;
    return true;
}

static int ep_dispatch(void *ctx, int il, int32_t *act, int n_act, const int32_t *off, const float *xg)
{
    ep_group *g = ctx;
    if (il == g->first_moe) ep_step_start(g);
    g->t0 = util_now();
    g->off = off;
    const uint64_t *h = g->holders + (size_t)il * g->E;
    memset(g->assigned, 0, sizeof g->assigned);
    for (int i = 0; i < g->n_members; i++) g->links[i].n_exp = g->links[i].n_frames = 0;
    int n_local = 0;
    for (int i = 0; i < n_act; i++) {
        int x = act[i], rows = off[x + 1] - off[x], best = 0;
        bool have = false;
        for (int p = 0; p < g->n_procs; p++) {
            if (!(h[x] >> p & 1) || (p > 0 && !g->links[p - 1].up)) continue;
            if (!have || g->assigned[p] < g->assigned[best]) best = p;
            have = true;
        }
        /* one frame holds an expert's rows whole: larger ones stay here */
        if (best > 0 && (size_t)rows * g->dim > EP_FRAME_FLOATS) best = 0;
        g->assigned[best] += rows;
        if (best == 0) {
            g->tmp[n_local++] = x;
            continue;
        }
        ep_link *l = &g->links[best - 1];
        l->exp[l->n_exp] = x;
        l->rows[l->n_exp++] = rows;
    }
    for (int i = 0; i < g->n_members; i++) {
        ep_link *l = &g->links[i];
        if (!l->n_exp) continue;
        /* two micro-batches: the experts cut where the rows reach half, so that the member
         * computes the second while the first's outputs are on the wire */
        int cut = l->n_exp;
        if (g->micro_batches > 1 && l->n_exp > 1) {
            int64_t all = 0, run = l->rows[0];
            for (int k = 0; k < l->n_exp; k++) all += l->rows[k];
            for (cut = 1; cut < l->n_exp - 1 && 2 * run < all; cut++) run += l->rows[cut];
        }
        size_t fl = 0;
        l->frame0[0] = 0;
        l->n_mb = 1;
        l->mb_frame[0] = 0;
        for (int k = 0; k < l->n_exp; k++) {
            size_t r = (size_t)l->rows[k] * g->dim;
            if (k == cut) {
                l->frame0[++l->n_frames] = k;
                l->mb_frame[l->n_mb++] = l->n_frames;
                fl = 0;
            } else if (fl > 0 && fl + r > EP_FRAME_FLOATS) {
                l->frame0[++l->n_frames] = k;
                fl = 0;
            }
            fl += r;
        }
        l->frame0[++l->n_frames] = l->n_exp;
        l->mb_frame[l->n_mb] = l->n_frames;
        g->n_split += l->n_mb == 2;
        bool ok = true;
        for (int f = 0; f < l->n_frames && ok; f++) ok = ep_send_frame(g, l, il, f, xg);
        if (!ok) {
            char why[64];
            snprintf(why, sizeof why, "send: %s", strerror(errno));
            ep_link_down(g, l, why);
            for (int k = 0; k < l->n_exp; k++) g->tmp[n_local++] = l->exp[k];
            l->n_exp = l->n_frames = 0;
        }
    }
    memcpy(act, g->tmp, (size_t)n_local * sizeof *act);
    for (int k = 0; k < n_local; k++) g->rows_local += (uint64_t)(off[act[k] + 1] - off[act[k]]);
    g->t_sent = util_now();
    return n_local;
}

/* One reply frame f of l: its experts as sent, rows into ye. */
static bool ep_recv_frame(ep_group *g, ep_link *l, int il, int f, float *ye, char *why, size_t whysz)
{
    proto_msg m;
    proto_status st = proto_recv(&l->pc, &m);
    if (st != PROTO_OK) {
        snprintf(why, whysz, "%s", st == PROTO_ERR_IO && errno == ETIMEDOUT ? "no answer in time" : proto_status_name(st));
        return false;
    }
    int a = l->frame0[f], b = l->frame0[f + 1];
    bool ok = m.hdr.type == PROTO_EXPERTS_OUT && m.u.experts.layer == il && (int)m.u.experts.dim == g->dim &&
              (int)m.u.experts.n_exp == b - a &&
              m.hdr.flags == ep_frame_flags(l->n_mb, l->mb_frame, l->n_frames, f);
    for (int i = 0; ok && i < b - a; i++) ok = m.u.experts.experts[i] == l->exp[a + i] && m.u.experts.n_rows[i] == l->rows[a + i];
    if (!ok) {
        if (m.hdr.type == PROTO_ERROR) snprintf(why, whysz, "error: %s", m.u.error.msg ? m.u.error.msg : "?");
        else snprintf(why, whysz, "a reply that does not match the request");
        proto_msg_free(&m);
        return false;
    }
    size_t o = 0;
    for (int i = a; i < b; i++) {
        size_t k = (size_t)l->rows[i] * g->dim;
        memcpy(ye + (size_t)g->off[l->exp[i]] * g->dim, m.u.experts.x + o, k * sizeof(float));
        o += k;
        l->rows_out += (uint64_t)l->rows[i];
    }
    l->bytes_in += PROTO_HDR_SIZE + m.hdr.len;
    proto_msg_free(&m);
    return true;
}

static int ep_combine(void *ctx, int il, float *ye, int32_t *act)
{
    ep_group *g = ctx;
    double t = util_now();
    int n_fail = 0;
    bool any = false;
    for (int i = 0; i < g->n_members; i++) {
        ep_link *l = &g->links[i];
        if (!l->n_frames) continue;
        any = true;
        l->pc.deadline = util_now() + g->timeout_s;
        char why[160];
        int f = 0;
        while (f < l->n_frames && ep_recv_frame(g, l, il, f, ye, why, sizeof why)) f++;
        l->pc.deadline = 0;
        if (f < l->n_frames) {
            ep_link_down(g, l, why);
            for (int k = l->frame0[f]; k < l->n_exp; k++) act[n_fail++] = l->exp[k];
        }
    }
    if (any) {
        double now = util_now();
        pthread_mutex_lock(&g->mu);
        g->exch_s += now - g->t0;
        g->wait_s += now - t;
        g->n_exchanges++;
        pthread_mutex_unlock(&g->mu);
        g->step_exch_s += now - g->t0;
        g->step_wait_s += now - t;
        g->step_n++;
    }
    if (il == g->last_moe && g->step_n > 0)
        log_debug("ep: step: %d layers exchanged, %.3f ms from dispatch to the last reply, %.3f ms waited for it, "
                  "%.0f%% hidden", g->step_n, 1e3 * g->step_exch_s, 1e3 * g->step_wait_s,
                  g->step_exch_s > 0 ? 100 * (1 - g->step_wait_s / g->step_exch_s) : 0.0);
    return n_fail;
}

static void ep_metrics_hook(void *ctx, bytebuf *b) { ep_group_metrics(ctx, b); }

static void ep_status_hook(void *ctx, bytebuf *b)
{
    ep_summary s;
    ep_group_summary(ctx, &s);
    bytebuf_printf(b, "expert group: %d processes, %d up; imbalance %.3f with experts in ranges, %.3f as placed "
                      "(%llu placements from the live load); %.0f%% of the exchange hidden behind the leader's experts",
                   s.n_procs, s.n_up + 1, s.imb_contiguous, s.imb_placed, (unsigned long long)s.n_rebalances, 100 * s.hidden);
}

ep_group *ep_group_new(engine *e, const ep_opts *o, char *err, size_t errsz)
{
    const model *m = engine_model(e);
    const model_hparams *hp = &m->hp;
    if (hp->n_expert < 2) {
        snprintf(err, errsz, "expert parallelism needs a mixture-of-experts model (%s has no experts)", hp->arch_name);
        return NULL;
    }
    if (o->n_members < 1 || o->n_members > EP_MAX_MEMBERS) {
        snprintf(err, errsz, "an expert group has 1 to %d members, not %d", EP_MAX_MEMBERS, o->n_members);
        return NULL;
    }
    const int P = o->n_members + 1;
    if (o->redundant < 0 || (o->redundant > 0 && (hp->n_expert + o->redundant) % P)) {
        snprintf(err, errsz, "--redundant-experts %d: experts + redundant (%d + %d) must be a multiple of the group's %d processes",
                 o->redundant, hp->n_expert, o->redundant, P);
        return NULL;
    }
    if (o->redundant > hp->n_expert * (P - 1)) {
        snprintf(err, errsz, "--redundant-experts %d: at most %d (every expert on every process)", o->redundant,
                 hp->n_expert * (P - 1));
        return NULL;
    }
    ep_group *g = xcalloc(1, sizeof *g);
    g->e = e;
    g->m = m;
    g->n_members = o->n_members;
    g->n_procs = P;
    g->E = hp->n_expert;
    g->n_layers = hp->n_layers;
    g->dim = hp->dim;
    g->redundant = o->redundant;
    g->timeout_s = o->timeout_s > 0 ? o->timeout_s : 5.0;
    g->rebalance_s = o->rebalance_s;
    g->key = *o->key;
    g->micro_batches = o->micro_batches == 1 ? 1 : 2;
    g->first_moe = g->last_moe = -1;
    for (int il = 0; il < hp->n_layers; il++)
        if (m->layers[il].gate_exps.data) {
            if (g->first_moe < 0) g->first_moe = il;
            g->last_moe = il;
        }
    pthread_mutex_init(&g->mu, NULL);
    util_cond_init(&g->cv);
    g->links = xcalloc((size_t)o->n_members, sizeof *g->links);
    g->want = xcalloc((size_t)o->n_members, sizeof *g->want);
    g->tmp = xmalloc((size_t)g->E * sizeof *g->tmp);
    g->holders = xcalloc((size_t)g->n_layers * g->E, sizeof *g->holders);
    g->holders_next = xcalloc((size_t)g->n_layers * g->E, sizeof *g->holders_next);
    for (int i = 0; i < o->n_members; i++) {
        ep_link *l = &g->links[i];
        snprintf(l->addr, sizeof l->addr, "%s", o->members[i]);
        l->pc.fd = -1;
        l->pending_fd = -1;
        l->exp = xmalloc((size_t)g->E * sizeof *l->exp);
        l->rows = xmalloc((size_t)g->E * sizeof *l->rows);
        l->frame0 = xmalloc((size_t)(g->E + 1) * sizeof *l->frame0);
        l->buf = (bytebuf){ 0 };
    }
    for (int i = 0; i < o->n_members; i++) {
        ep_link *l = &g->links[i];
        char why[200];
        if (ep_link_open(l->addr, &g->key, m, engine_max_batch(e), &l->pc, why, sizeof why) < 0) {
            snprintf(err, errsz, "expert member %s", why);
            ep_group_free(g);
            return NULL;
        }
        l->up = true;
    }
    ep_place(g);
    uint64_t *t = g->holders;
    g->holders = g->holders_next;
    g->holders_next = t;
    g->next_rebalance = util_now() + g->rebalance_s;
    if (pthread_create(&g->thr, NULL, ep_reconnect_main, g)) {
        snprintf(err, errsz, "cannot start a thread");
        ep_group_free(g);
        return NULL;
    }
    g->thr_started = true;
    g->hooks = (engine_ep_hooks){ .ctx = g, .dispatch = ep_dispatch, .combine = ep_combine,
                                  .metrics = ep_metrics_hook, .status = ep_status_hook };
    engine_set_ep(e, &g->hooks);
    return g;
}

void ep_group_free(ep_group *g)
{
    if (!g) return;
    if (g->hooks.ctx) engine_set_ep(g->e, NULL);
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (g->thr_started) pthread_join(g->thr, NULL);
    for (int i = 0; i < g->n_members; i++) {
        ep_link *l = &g->links[i];
        ep_link_close(l);
        if (l->pending_fd >= 0) {
            close(l->pending_fd);
            proto_conn_free(&l->pending_pc);
        }
        free(l->exp);
        free(l->rows);
        free(l->frame0);
        free(l->gbuf);
        bytebuf_free(&l->buf);
    }
    free(g->links);
    free(g->want);
    free(g->tmp);
    free(g->holders);
    free(g->holders_next);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

int ep_group_size(const ep_group *g) { return g->n_procs; }

int ep_group_up(ep_group *g)
{
    int n = 0;
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->n_members; i++) n += g->links[i].up || g->links[i].pending_fd >= 0;
    pthread_mutex_unlock(&g->mu);
    return n;
}

/* Imbalance of both placements over the load window, mean over the MoE layers (under mu). */
static void ep_imbalances(ep_group *g, double *contig, double *placed)
{
    const int E = g->E;
    uint64_t *win = xmalloc((size_t)E * sizeof *win), *cont = xmalloc((size_t)E * sizeof *cont);
    double *load = xmalloc((size_t)E * sizeof *load);
    ep_contiguous(E, g->n_procs, cont);
    double sc = 0, sp = 0;
    int n = 0;
    for (int il = 0; il < g->n_layers; il++) {
        if (!g->m->layers[il].gate_exps.data || !engine_moe_load(g->e, il, win, NULL, NULL)) continue;
        double all = 0;
        for (int x = 0; x < E; x++) all += (double)(load[x] = (double)win[x]);
        if (all <= 0) continue;
        sc += ep_placement_imbalance(load, E, cont, g->n_procs);
        sp += ep_placement_imbalance(load, E, g->holders + (size_t)il * E, g->n_procs);
        n++;
    }
    *contig = n ? sc / n : 0;
    *placed = n ? sp / n : 0;
    free(win);
    free(cont);
    free(load);
}

void ep_group_summary(ep_group *g, ep_summary *s)
{
    memset(s, 0, sizeof *s);
    s->n_procs = g->n_procs;
    s->n_up = ep_group_up(g);
    pthread_mutex_lock(&g->mu);
    ep_imbalances(g, &s->imb_contiguous, &s->imb_placed);
    s->hidden = g->exch_s > 0 ? 1.0 - g->wait_s / g->exch_s : 0;
    s->n_rebalances = g->n_rebalances;
    pthread_mutex_unlock(&g->mu);
}

void ep_group_metrics(ep_group *g, bytebuf *b)
{
    ep_summary s;
    ep_group_summary(g, &s);
    pthread_mutex_lock(&g->mu);
    bytebuf_printf(b, "# HELP tokenmill_ep_processes Processes of the expert-parallel group (the leader and its members), and those up.\n"
                      "# TYPE tokenmill_ep_processes gauge\n"
                      "tokenmill_ep_processes{state=\"all\"} %d\ntokenmill_ep_processes{state=\"up\"} %d\n",
                   s.n_procs, s.n_up + 1);
    bytebuf_puts(b, "# HELP tokenmill_ep_rows_total Expert input rows computed by each process of the group.\n"
                    "# TYPE tokenmill_ep_rows_total counter\n");
    bytebuf_printf(b, "tokenmill_ep_rows_total{process=\"0\",member=\"leader\"} %llu\n", (unsigned long long)g->rows_local);
    for (int i = 0; i < g->n_members; i++)
        bytebuf_printf(b, "tokenmill_ep_rows_total{process=\"%d\",member=\"%s\"} %llu\n", i + 1, g->links[i].addr,
                       (unsigned long long)g->links[i].rows_out);
    bytebuf_puts(b, "# HELP tokenmill_ep_member_failures_total Times a member went down (its experts then ran on the leader).\n"
                    "# TYPE tokenmill_ep_member_failures_total counter\n");
    for (int i = 0; i < g->n_members; i++)
        bytebuf_printf(b, "tokenmill_ep_member_failures_total{member=\"%s\"} %llu\n", g->links[i].addr,
                       (unsigned long long)g->links[i].failures);
    bytebuf_puts(b, "# HELP tokenmill_ep_bytes_total Bytes of expert frames to and from the members.\n"
                    "# TYPE tokenmill_ep_bytes_total counter\n");
    uint64_t bo = 0, bi = 0;
    for (int i = 0; i < g->n_members; i++) { bo += g->links[i].bytes_out; bi += g->links[i].bytes_in; }
    bytebuf_printf(b, "tokenmill_ep_bytes_total{dir=\"out\"} %llu\ntokenmill_ep_bytes_total{dir=\"in\"} %llu\n",
                   (unsigned long long)bo, (unsigned long long)bi);
    bytebuf_printf(b, "# HELP tokenmill_ep_exchanges_total MoE layers whose experts went to members.\n"
                      "# TYPE tokenmill_ep_exchanges_total counter\ntokenmill_ep_exchanges_total %llu\n"
                      "# HELP tokenmill_ep_exchange_seconds_total Time from a layer's dispatch to the last member's reply.\n"
                      "# TYPE tokenmill_ep_exchange_seconds_total counter\ntokenmill_ep_exchange_seconds_total %.6f\n"
                      "# HELP tokenmill_ep_wait_seconds_total Of that, the time the step waited for replies after its own experts.\n"
                      "# TYPE tokenmill_ep_wait_seconds_total counter\ntokenmill_ep_wait_seconds_total %.6f\n"
                      "# HELP tokenmill_ep_hidden_ratio Share of the exchange time hidden behind the leader's own experts.\n"
                      "# TYPE tokenmill_ep_hidden_ratio gauge\ntokenmill_ep_hidden_ratio %.4f\n"
                      "# HELP tokenmill_ep_micro_batches Micro-batches per member and layer (2: --ep-overlap on).\n"
                      "# TYPE tokenmill_ep_micro_batches gauge\ntokenmill_ep_micro_batches %d\n"
                      "# HELP tokenmill_ep_split_exchanges_total Member exchanges sent as two micro-batches (a member given one expert gets one).\n"
                      "# TYPE tokenmill_ep_split_exchanges_total counter\ntokenmill_ep_split_exchanges_total %llu\n",
                   (unsigned long long)g->n_exchanges, g->exch_s, g->wait_s, s.hidden, g->micro_batches,
                   (unsigned long long)g->n_split);
    bytebuf_printf(b, "# HELP tokenmill_ep_imbalance Busiest process's expert load over the mean, over the load window, mean over MoE layers: with experts in contiguous ranges, and with the current placement.\n"
                      "# TYPE tokenmill_ep_imbalance gauge\n"
                      "tokenmill_ep_imbalance{placement=\"contiguous\"} %.6g\ntokenmill_ep_imbalance{placement=\"current\"} %.6g\n"
                      "# HELP tokenmill_ep_rebalances_total EPLB placements computed from the live load and switched in.\n"
                      "# TYPE tokenmill_ep_rebalances_total counter\ntokenmill_ep_rebalances_total %llu\n",
                   s.imb_contiguous, s.imb_placed, (unsigned long long)s.n_rebalances);
    pthread_mutex_unlock(&g->mu);
}

/* ---- the member ------------------------------------------------------------------------- */

struct ep_member {
    model *m;
    int n_threads;
    const auth_key *key;
    int lfd;
    int port;
    pthread_t acc;
    pthread_mutex_t mu;          /* the engine, n_conns, fds */
    pthread_cond_t cv;
    engine *e;                   /* sized for the largest leader batch so far */
    int n_conns;
    int fds[EP_MEMBER_CONNS];
    bool stop;
    uint64_t served;
    double delay_s;              /* TOKENMILL_EP_DELAY_MS: an emulated one-way link latency, 0: none */
};

typedef struct {
    ep_member *mb;
    int slot;
    proto_conn pc;
    char peer[64];
    /* one layer's exchange */
    int32_t *exp, *rows;         /* (cap_exp) */
    int n_exp, cap_exp;
    int32_t *frame0;             /* (cap_exp + 1) */
    int n_frames;
    int n_mb;                    /* micro-batches: 1 or 2 */
    int mb_frame[3], mb_exp[3];  /* each one's first frame and first expert, then the ends */
    float *x, *y;                /* (cap_f) */
    size_t n_f, cap_f;
    int layer;
} ep_mconn;

static void ep_mconn_error(ep_mconn *c, uint32_t code, const char *msg)
{
    proto_msg m = { .hdr = { .type = PROTO_ERROR } };
    m.u.error.code = code;
    m.u.error.msg = (char *)msg;
    proto_send_msg(&c->pc, &m);
    log_warn("ep member: %s: %s", c->peer, msg);
}

/* Makes sure the engine takes batches of max_batch tokens (under mu). */
static bool ep_member_engine(ep_member *mb, int max_batch, char *err, size_t errsz)
{
    if (mb->e && engine_max_batch(mb->e) >= max_batch) return true;
    engine_free(mb->e);
    mb->e = NULL;
    engine_opts eo = { .n_threads = mb->n_threads, .n_kv_blocks = 1, .max_batch_tokens = max_batch };
    return engine_new(mb->m, &eo, &mb->e, err, errsz) == ENGINE_OK;
}

/* Appends one EXPERTS frame's experts and rows to the layer's exchange. */
static bool ep_mconn_take(ep_mconn *c, const proto_experts *x, bool first, const char **why)
{
    const model_hparams *hp = &c->mb->m->hp;
    if ((int)x->dim != hp->dim || x->layer >= hp->n_layers || !c->mb->m->layers[x->layer].gate_exps.data) {
        *why = "a layer or width this model does not have";
        return false;
    }
    if (!first && x->layer != c->layer) { *why = "frames of two layers in one exchange"; return false; }
    c->layer = x->layer;
    if (c->n_exp + (int)x->n_exp > hp->n_expert) { *why = "more experts than the model has"; return false; }
    for (uint32_t i = 0; i < x->n_exp; i++)
        if (x->experts[i] >= hp->n_expert || (c->n_exp > 0 && i == 0 && x->experts[0] <= c->exp[c->n_exp - 1])) {
            *why = "expert ids out of range or not ascending";
            return false;
        }
    memcpy(c->exp + c->n_exp, x->experts, x->n_exp * sizeof *c->exp);
    memcpy(c->rows + c->n_exp, x->n_rows, x->n_exp * sizeof *c->rows);
    c->n_exp += (int)x->n_exp;
    c->frame0[++c->n_frames] = c->n_exp;
    if (c->n_f + x->n_floats > c->cap_f) {
        size_t cap = c->cap_f ? c->cap_f : 1u << 16;
        while (cap < c->n_f + x->n_floats) cap *= 2;
        c->x = xrealloc(c->x, cap * sizeof(float));
        c->y = xrealloc(c->y, cap * sizeof(float));
        c->cap_f = cap;
    }
    memcpy(c->x + c->n_f, x->x, (size_t)x->n_floats * sizeof(float));
    c->n_f += x->n_floats;
    return true;
}

/* Sleeps until util_now() reaches t. */
static void ep_sleep_until(double t)
{
    double d = t - util_now();
    if (d > 0) usleep((useconds_t)(d * 1e6));
}

/* Sends micro-batch k's outputs (frames mb_frame[k]..mb_frame[k + 1] of y from float *yo). */
static bool ep_mconn_send(ep_mconn *c, int k, size_t *yo)
{
    const int dim = c->mb->m->hp.dim;
    for (int f = c->mb_frame[k]; f < c->mb_frame[k + 1]; f++) {
        int a = c->frame0[f], b = c->frame0[f + 1];
        size_t n = 0;
        for (int i = a; i < b; i++) n += (size_t)c->rows[i] * dim;
        proto_msg out = { .hdr = { .type = PROTO_EXPERTS_OUT,
                                   .flags = ep_frame_flags(c->n_mb, c->mb_frame, c->n_frames, f) } };
        out.u.experts = (proto_experts){ .layer = (uint16_t)c->layer, .dim = (uint32_t)dim, .n_exp = (uint32_t)(b - a),
                                         .experts = c->exp + a, .n_rows = c->rows + a, .n_floats = (uint32_t)n,
                                         .x = c->y + *yo };
        if (proto_send_msg(&c->pc, &out) != PROTO_OK) return false;
        *yo += n;
    }
    return true;
}

/* Computes the layer's micro-batches in turn and answers each as soon as it is done (and due,
 * under an emulated latency), so that the first one's outputs travel while the second is
 * computed. false when the link is to be closed. */
static bool ep_mconn_answer(ep_mconn *c)
{
    ep_member *mb = c->mb;
    const int dim = mb->m->hp.dim;
    double due[2];
    size_t xo = 0, yo = 0;
    int sent = 0;
    ep_sleep_until(util_now() + mb->delay_s);   /* the request's way over the emulated link */
    for (int k = 0; k < c->n_mb; k++) {
        int a = c->mb_exp[k], b = c->mb_exp[k + 1];
        size_t n = 0;
        for (int i = a; i < b; i++) n += (size_t)c->rows[i] * dim;
        pthread_mutex_lock(&mb->mu);
        engine_status es = engine_moe_experts_run(mb->e, c->layer, b - a, c->exp + a, c->rows + a, c->x + xo, c->y + xo);
        mb->served += k == 0;
        pthread_mutex_unlock(&mb->mu);
        if (es != ENGINE_OK) {
            ep_mconn_error(c, PROTO_E_ARG, "the experts' rows do not fit this member's batch");
            return false;
        }
        xo += n;
        due[k] = util_now() + mb->delay_s;
        for (; sent <= k && (k == c->n_mb - 1 || due[sent] <= util_now()); sent++) {
            ep_sleep_until(due[sent]);
            if (!ep_mconn_send(c, sent, &yo)) return false;
        }
    }
    return true;
}

static void ep_member_serve(ep_mconn *c)
{
    ep_member *mb = c->mb;
    const model *m = mb->m;
    char why[160];
    c->pc.deadline = util_now() + 5.0;
    if (auth_handshake(&c->pc, mb->key, AUTH_SIDE_WORKER, why, sizeof why) != AUTH_OK) {
        log_warn("ep member: %s: handshake: %s", c->peer, why);
        return;
    }
    proto_msg h;
    if (proto_recv(&c->pc, &h) != PROTO_OK) return;
    if (h.hdr.type != PROTO_HELLO || h.u.hello.role != PROTO_ROLE_EXPERT) {
        proto_msg_free(&h);
        ep_mconn_error(c, PROTO_E_ROLE, "this is an expert member (tokenmill expert): only an expert group's leader connects");
        return;
    }
    bool same = !memcmp(h.u.hello.model_fp, m->fingerprint, 32);
    int max_batch = (int)h.u.hello.max_batch_tokens;
    proto_msg_free(&h);
    if (!same) {
        ep_mconn_error(c, PROTO_E_MODEL, "another model: the leader's fingerprint differs from this member's");
        return;
    }
    if (max_batch < 1 || max_batch > (1 << 20)) {
        ep_mconn_error(c, PROTO_E_ARG, "bad batch size");
        return;
    }
    pthread_mutex_lock(&mb->mu);
    bool ok = ep_member_engine(mb, max_batch, why, sizeof why);
    pthread_mutex_unlock(&mb->mu);
    if (!ok) {
        ep_mconn_error(c, PROTO_E_INTERNAL, why);
        return;
    }
    proto_msg r = { .hdr = { .type = PROTO_HELLO } };
    r.u.hello.role = PROTO_ROLE_EXPERT;
    memcpy(r.u.hello.model_fp, m->fingerprint, 32);
    r.u.hello.max_batch_tokens = (uint32_t)max_batch;
    r.u.hello.n_vocab = (uint32_t)m->hp.n_vocab;
    if (proto_send_msg(&c->pc, &r) != PROTO_OK) return;
    c->pc.deadline = 0;
    log_info("ep member: leader %s is in (batch %d)", c->peer, max_batch);
    c->cap_exp = m->hp.n_expert;
    c->exp = xmalloc((size_t)c->cap_exp * sizeof *c->exp);
    c->rows = xmalloc((size_t)c->cap_exp * sizeof *c->rows);
    c->frame0 = xmalloc((size_t)(c->cap_exp + 1) * sizeof *c->frame0);
    for (;;) {
        c->n_exp = c->n_frames = 0;
        c->n_f = 0;
        c->frame0[0] = 0;
        c->n_mb = 1;
        c->mb_frame[0] = c->mb_exp[0] = 0;
        const char *bad = NULL;
        bool last = false;
        /* every frame of the layer (both micro-batches) is read before anything is written */
        while (!last) {
            proto_msg q;
            proto_status st = proto_recv(&c->pc, &q);
            if (st != PROTO_OK) {
                if (st != PROTO_ERR_CLOSED) log_warn("ep member: %s: %s", c->peer, proto_status_name(st));
                else log_info("ep member: leader %s left", c->peer);
                return;
            }
            uint32_t fl = q.hdr.flags;
            if (q.hdr.type != PROTO_EXPERTS) bad = "a frame other than EXPERTS";
            else if (!ep_mconn_take(c, &q.u.experts, c->n_frames == 0, &bad)) {}
            else if ((fl & PROTO_F_MORE) && (!(fl & PROTO_F_LAST) || c->n_mb == 2))
                bad = "more than two micro-batches, or MORE without LAST";
            else if (fl & PROTO_F_MORE) {
                c->mb_frame[1] = c->n_frames;
                c->mb_exp[1] = c->n_exp;
                c->n_mb = 2;
            } else last = fl & PROTO_F_LAST;
            proto_msg_free(&q);
            if (bad) {
                ep_mconn_error(c, PROTO_E_ARG, bad);
                return;
            }
        }
        c->mb_frame[c->n_mb] = c->n_frames;
        c->mb_exp[c->n_mb] = c->n_exp;
        if (!ep_mconn_answer(c)) return;
    }
}

static void *ep_mconn_main(void *arg)
{
    ep_mconn *c = arg;
    ep_member *mb = c->mb;
    ep_member_serve(c);
    pthread_mutex_lock(&mb->mu);
    close(c->pc.fd);
    mb->fds[c->slot] = -1;
    mb->n_conns--;
    pthread_cond_broadcast(&mb->cv);
    pthread_mutex_unlock(&mb->mu);
    proto_conn_free(&c->pc);
    free(c->exp);
    free(c->rows);
    free(c->frame0);
    free(c->x);
    free(c->y);
    free(c);
    return NULL;
}

static void *ep_accept_main(void *arg)
{
    ep_member *mb = arg;
    for (;;) {
        char host[64];
        int fd = proto_accept(mb->lfd, host, sizeof host);
        pthread_mutex_lock(&mb->mu);
        bool stop = mb->stop;
        pthread_mutex_unlock(&mb->mu);
        if (stop) {
            if (fd >= 0) close(fd);
            return NULL;
        }
        if (fd < 0) {
            if (errno != EINTR && errno != ECONNABORTED) usleep(10000);
            continue;
        }
        pthread_mutex_lock(&mb->mu);
        int slot = -1;
        for (int i = 0; i < EP_MEMBER_CONNS && slot < 0; i++)
            if (mb->fds[i] < 0) slot = i;
        if (slot < 0) {
            pthread_mutex_unlock(&mb->mu);
            log_warn("ep member: %s refused: %d connections already", host, EP_MEMBER_CONNS);
            close(fd);
            continue;
        }
        mb->fds[slot] = fd;
        mb->n_conns++;
        pthread_mutex_unlock(&mb->mu);
        ep_mconn *c = xcalloc(1, sizeof *c);
        c->mb = mb;
        c->slot = slot;
        proto_conn_init(&c->pc, fd);
        snprintf(c->peer, sizeof c->peer, "%s", host);
        pthread_t t;
        if (pthread_create(&t, NULL, ep_mconn_main, c)) {
            pthread_mutex_lock(&mb->mu);
            mb->fds[slot] = -1;
            mb->n_conns--;
            pthread_mutex_unlock(&mb->mu);
            close(fd);
            free(c);
            continue;
        }
        pthread_detach(t);
    }
}

ep_member *ep_member_new(model *m, int n_threads, const char *hostport, const auth_key *key, char *err,
                         size_t errsz)
{
    if (m->hp.n_expert < 2) {
        snprintf(err, errsz, "an expert member needs a mixture-of-experts model (%s has no experts)", m->hp.arch_name);
        return NULL;
    }
    err[0] = 0;
    ep_member *mb = xcalloc(1, sizeof *mb);
    mb->m = m;
    mb->n_threads = n_threads;
    const char *dz = getenv("TOKENMILL_EP_DELAY_MS");   /* benchmarks: see docs/ep.md */
    mb->delay_s = dz && atof(dz) > 0 ? atof(dz) / 1e3 : 0;
    if (mb->delay_s > 0)
        log_warn("ep member: TOKENMILL_EP_DELAY_MS: each layer's request and answer held %.3f ms (an emulated link "
                 "latency)", mb->delay_s * 1e3);
    mb->key = key;
    for (int i = 0; i < EP_MEMBER_CONNS; i++) mb->fds[i] = -1;
    pthread_mutex_init(&mb->mu, NULL);
    util_cond_init(&mb->cv);
    mb->lfd = proto_listen(hostport, 16);
    if (mb->lfd < 0) {
        snprintf(err, errsz, "cannot listen on %s: %s", hostport, strerror(errno));
        pthread_mutex_destroy(&mb->mu);
        pthread_cond_destroy(&mb->cv);
        free(mb);
        return NULL;
    }
    mb->port = proto_local_port(mb->lfd);
    /* an engine for the default batch now, so that a model the engine refuses fails here */
    if (!ep_member_engine(mb, 512, err, errsz) || pthread_create(&mb->acc, NULL, ep_accept_main, mb)) {
        if (!err[0]) snprintf(err, errsz, "cannot start a thread");
        close(mb->lfd);
        engine_free(mb->e);
        pthread_mutex_destroy(&mb->mu);
        pthread_cond_destroy(&mb->cv);
        free(mb);
        return NULL;
    }
    return mb;
}

int ep_member_port(const ep_member *mb) { return mb->port; }

uint64_t ep_member_served(ep_member *mb)
{
    pthread_mutex_lock(&mb->mu);
    uint64_t n = mb->served;
    pthread_mutex_unlock(&mb->mu);
    return n;
}

void ep_member_free(ep_member *mb)
{
    if (!mb) return;
    pthread_mutex_lock(&mb->mu);
    mb->stop = true;
    for (int i = 0; i < EP_MEMBER_CONNS; i++)
        if (mb->fds[i] >= 0) shutdown(mb->fds[i], SHUT_RDWR);
    pthread_mutex_unlock(&mb->mu);
    shutdown(mb->lfd, SHUT_RDWR);
    pthread_join(mb->acc, NULL);
    close(mb->lfd);
    pthread_mutex_lock(&mb->mu);
    while (mb->n_conns > 0) util_cond_wait_ms(&mb->cv, &mb->mu, 100);
    pthread_mutex_unlock(&mb->mu);
    engine_free(mb->e);
    pthread_mutex_destroy(&mb->mu);
    pthread_cond_destroy(&mb->cv);
    free(mb);
}
