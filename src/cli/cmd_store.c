/*
 * cmd_store: `tokenmill store stat|ls|gc|fsck SPEC` — inspect and maintain a block store
 * (src/cache/store.h) from the command line. stat and ls only read; gc and fsck delete.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/blockkey.h"
#include "cache/gc.h"
#include "cache/store.h"
#include "cli/cmd.h"
#include "cli/cmd_opts.h"
#include "model/quant.h"
#include "util/util.h"

#define CMD_STORE_AGES 6
static const double cmd_store_age_edge[CMD_STORE_AGES - 1] = { 3600, 86400, 3 * 86400, 7 * 86400, 30 * 86400 };
static const char *cmd_store_age_name[CMD_STORE_AGES] = { "<1h", "1h-1d", "1d-3d", "3d-7d", "7d-30d", ">30d" };

typedef struct {
    double now;
    uint64_t files[32];          /* per target */
    uint64_t bytes[32];
    uint64_t age_n[CMD_STORE_AGES];     /* by time since last use */
    uint64_t age_bytes[CMD_STORE_AGES];
    uint64_t n_expired;          /* expiry already passed (gc will remove) */
    double oldest;               /* largest age seen, seconds */
    uint8_t (*keys)[32];         /* (n_keys, cap_keys) every key listed (ec: once per fragment) */
    size_t n_keys, cap_keys;
} cmd_store_stat_acc;

/* Blocks of one geometry among the headers read (stat's block size lines). */
#define CMD_STORE_GEOMS 8
#define CMD_STORE_PEEK_MAX 1024   /* headers read at most (spread over the keys) */
typedef struct {
    block_header h;              /* shape fields of the first block of this geometry */
    uint64_t n;                  /* headers read with it */
} cmd_store_geom;

static void cmd_store_stat_cb(void *arg, int target, const uint8_t key[32], uint64_t bytes, double last_use,
                              double expiry)
{
    cmd_store_stat_acc *a = arg;
    if (target < 32) {
        a->files[target]++;
        a->bytes[target] += bytes;
    }
    double age = a->now - last_use;
    int b = 0;
    while (b < CMD_STORE_AGES - 1 && age >= cmd_store_age_edge[b]) b++;
    a->age_n[b]++;
    a->age_bytes[b] += bytes;
    if (expiry <= a->now) a->n_expired++;
    if (age > a->oldest) a->oldest = age;
    if (a->n_keys == a->cap_keys) {
        a->cap_keys = a->cap_keys ? 2 * a->cap_keys : 256;
        a->keys = xrealloc(a->keys, a->cap_keys * sizeof *a->keys);
    }
    memcpy(a->keys[a->n_keys++], key, 32);
}

static int cmd_store_key_cmp(const void *x, const void *y) { return memcmp(x, y, 32); }

/* The size of a 128-token block, from the blocks' own headers (no model needed): one line per
 * geometry and pool (the model's fingerprint with the KV type: blockkey_pool_fp) among at most
 * CMD_STORE_PEEK_MAX blocks spread over the store. A store that holds the blocks of several
 * pools (models, or one model in several KV types) says each line's pool, by its first bytes. */
static void cmd_store_stat_geometry(store *s, cmd_store_stat_acc *a)
{
    size_t n = 0;
    qsort(a->keys, a->n_keys, 32, cmd_store_key_cmp);
    for (size_t i = 0; i < a->n_keys; i++)
        if (!n || memcmp(a->keys[n - 1], a->keys[i], 32)) memcpy(a->keys[n++], a->keys[i], 32);
    if (!n) return;
    cmd_store_geom g[CMD_STORE_GEOMS];
    int n_g = 0;
    uint64_t n_read = 0, n_other = 0;
    size_t step = n > CMD_STORE_PEEK_MAX ? n / CMD_STORE_PEEK_MAX : 1;
    for (size_t i = 0; i < n; i += step) {
        block_header h;
        if (store_peek_header(s, a->keys[i], &h) != STORE_OK) continue;
        n_read++;
        int j = 0;
        while (j < n_g && (g[j].h.payload_bytes != h.payload_bytes || g[j].h.n_layers != h.n_layers ||
                           g[j].h.n_kv_heads != h.n_kv_heads || g[j].h.head_dim != h.head_dim ||
                           g[j].h.n_parts != h.n_parts || g[j].h.dtype != h.dtype || g[j].h.geom != h.geom ||
                           memcmp(g[j].h.fp, h.fp, 32)))
            j++;
        if (j == n_g && n_g == CMD_STORE_GEOMS) {
            n_other++;
            continue;
        }
        if (j == n_g) g[n_g++] = (cmd_store_geom){ h, 0 };
        g[j].n++;
    }
    bool pools = false;
    for (int j = 1; j < n_g; j++) pools |= memcmp(g[j].h.fp, g[0].h.fp, 32) != 0;
    printf("block size per 128 tokens (headers of %llu of %zu blocks):\n", (unsigned long long)n_read, n);
    for (int j = 0; j < n_g; j++) {
        const block_header *h = &g[j].h;
        char pool[32] = "";
        if (pools)
            snprintf(pool, sizeof pool, " (pool %02x%02x%02x%02x)", h->fp[0], h->fp[1], h->fp[2], h->fp[3]);
        printf("  %.1f KiB: %u layers x %u kv head%s x %s%u, %s, %s: %llu blocks%s\n", (double)h->payload_bytes / 1024.0,
               h->n_layers, h->n_kv_heads, h->n_kv_heads == 1 ? "" : "s", h->layer_bytes ? "" : "rows per layer up to ",
               h->head_dim,
               h->n_parts == 1 ? "V is K (latent)" : "K and V", quant_type_name((qtype)h->dtype),
               (unsigned long long)g[j].n, pool);
    }
    if (n_other) printf("  other geometries: %llu blocks\n", (unsigned long long)n_other);
}

static void cmd_store_ls_cb(void *arg, int target, const uint8_t key[32], uint64_t bytes, double last_use,
                            double expiry)
{
    double now = *(double *)arg;
    char hex[BLOCKKEY_HEX];
    blockkey_hex(key, hex);
    printf("%d %s %llu %.0f %.0f\n", target, hex, (unsigned long long)bytes, now - last_use, expiry - now);
}

static double cmd_store_mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

static int cmd_store_stat(store *s)
{
    cmd_store_stat_acc a;
    memset(&a, 0, sizeof a);
    a.now = store_now(s);
    store_ls(s, cmd_store_stat_cb, &a);
    int k, m;
    store_geometry(s, &k, &m);
    int n_t = store_n_targets(s);
    uint64_t files = 0, bytes = 0;
    printf("store %s (%s)\n", store_spec(s), m ? "erasure coded" : "directory");
    for (int t = 0; t < n_t && t < 32; t++) {
        const char *root = store_target_root(s, t);
        printf("  target %d %s: %llu files, %.1f MiB\n", t, root ? root : "(unavailable)",
               (unsigned long long)a.files[t], cmd_store_mib(a.bytes[t]));
        files += a.files[t];
        bytes += a.bytes[t];
    }
    uint64_t blocks = m ? a.files[0] : files;   /* ec: estimate from one target */
    if (m) {
        uint64_t mx = 0;
        for (int t = 0; t < n_t && t < 32; t++) mx = TM_MAX(mx, a.files[t]);
        blocks = mx;
    }
    printf("blocks: %llu%s, files: %llu, bytes: %llu (%.1f MiB)\n", (unsigned long long)blocks,
           m ? " (largest target)" : "", (unsigned long long)files, (unsigned long long)bytes, cmd_store_mib(bytes));
    printf("expired (awaiting gc): %llu, oldest last use: %.1f h ago\n", (unsigned long long)a.n_expired,
           a.oldest / 3600.0);
    printf("age since last use:\n");
    for (int b = 0; b < CMD_STORE_AGES; b++)
        printf("  %-7s %8llu files %10.1f MiB\n", cmd_store_age_name[b], (unsigned long long)a.age_n[b],
               cmd_store_mib(a.age_bytes[b]));
    store_stats c;
    int n_proc = store_load_counters(s, &c);
    uint64_t lookups = c.n_hit + c.n_miss + c.n_corrupt;
    printf("counters (%d process%s): get %llu hit %llu miss %llu corrupt %llu (hit rate %.1f%%)\n", n_proc,
           n_proc == 1 ? "" : "es", (unsigned long long)c.n_get, (unsigned long long)c.n_hit,
           (unsigned long long)c.n_miss, (unsigned long long)c.n_corrupt,
           lookups ? 100.0 * (double)c.n_hit / (double)lookups : 0.0);
    printf("  put %llu dup %llu failed %llu (no space %llu) io errors %llu evicted %llu expired %llu\n",
           (unsigned long long)c.n_put, (unsigned long long)c.n_put_dup, (unsigned long long)c.n_put_fail,
           (unsigned long long)c.n_nospace, (unsigned long long)c.n_io_err, (unsigned long long)c.n_evicted,
           (unsigned long long)c.n_expired);
    if (m)
        printf("  fragments missing %llu corrupt %llu, decodes %llu\n", (unsigned long long)c.n_frag_missing,
               (unsigned long long)c.n_frag_corrupt, (unsigned long long)c.n_decode);
    cmd_store_stat_geometry(s, &a);
    free(a.keys);
    return 0;
}

int cmd_store(int argc, char **argv)
{
    store_opts o = { 0 };
    const cmd_opt opts[] = {
        { "--capacity", NULL, CMD_OPT_SIZE, &o.capacity_bytes, .arg = "SIZE", .help = "per-target capacity for gc (e.g. 20G)" },
        { "--retention", NULL, CMD_OPT_STR, &o.retention, .arg = "SPEC", .help = "TTLs per class for gc's view of new uses (agent=72h,chat=7d)" },
        { 0 },
    };
    const char *synopsis =
        "store stat|ls|gc|fsck SPEC [options]: block store maintenance\n"
        "  SPEC: dir:PATH | PATH | ec:K+M:DIR1,...,DIR(K+M)\n"
        "  stat: sizes, counts, age histogram, hit/miss counters (read only)\n"
        "  ls:   one line per file: target key bytes age_s expires_in_s (read only)\n"
        "  gc:   delete expired blocks, then LRU down to --capacity\n"
        "  fsck: verify every checksum, remove broken blocks/fragments";
    const char *pos[2] = { 0 };
    int n_pos = 0;
    cmd_opts_status ost = cmd_opts_parse("store", synopsis, opts, argc, argv, 1, pos, 2, &n_pos);
    if (ost != CMD_OPTS_OK) return cmd_opts_exit(ost);
    const char *sub = pos[0], *spec = pos[1];
    bool writes = sub && (!strcmp(sub, "gc") || !strcmp(sub, "fsck"));
    if (n_pos != 2 || (!writes && strcmp(sub, "stat") && strcmp(sub, "ls"))) {
        fprintf(stderr, "tokenmill store: %s\n", n_pos == 0 ? "needs stat, ls, gc or fsck and a SPEC"
                                                 : n_pos == 1 ? "needs a SPEC after the subcommand"
                                                              : "the subcommands are stat, ls, gc and fsck");
        cmd_opts_hint("store", synopsis);
        return 2;
    }
    o.read_only = !writes;
    store *s;
    store_status st = store_open(spec, &o, &s);
    if (st != STORE_OK) {
        fprintf(stderr, "tokenmill store: cannot open '%s': %s\n", spec, store_status_name(st));
        return st == STORE_ARG ? 2 : 1;
    }
    int rc = 0;
    if (!strcmp(sub, "stat")) {
        rc = cmd_store_stat(s);
    } else if (!strcmp(sub, "ls")) {
        double now = store_now(s);
        store_ls(s, cmd_store_ls_cb, &now);
    } else if (!strcmp(sub, "gc")) {
        uint64_t expired, evicted;
        store_gc(s, &expired, &evicted);
        printf("gc: %llu expired, %llu evicted\n", (unsigned long long)expired, (unsigned long long)evicted);
    } else {
        store_fsck_result r;
        store_fsck(s, &r);
        printf("fsck: %llu files (%.1f MiB), %llu ok, %llu broken (removed)", (unsigned long long)r.n_files,
               cmd_store_mib(r.bytes), (unsigned long long)r.n_ok, (unsigned long long)r.n_broken);
        int k, m;
        store_geometry(s, &k, &m);
        if (m)
            printf(", %llu blocks lost (removed), %llu degraded (%llu repaired)", (unsigned long long)r.n_lost,
                   (unsigned long long)r.n_degraded, (unsigned long long)r.n_repaired);
        printf("\n");
        rc = r.n_broken || r.n_lost ? 1 : 0;
    }
    store_close(s);
    return rc;
}
