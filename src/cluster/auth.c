/*
 * auth: key files, the challenge-response handshake and frame tags (see auth.h for the design,
 * docs/protocol.md for the bytes).
 *
 * HMAC-SHA256 through OpenSSL's EVP_MAC; each direction keeps one context, keyed again for
 * every frame (no allocation per frame). Proofs are compared with CRYPTO_memcmp.
 */
#include "cluster/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "cluster/proto.h"
#include "util/util.h"

const char *auth_status_name(auth_status st)
{
    static const char *names[] = { "ok", "key file", "refused", "no handshake", "i/o error", "crypto error" };
    return (unsigned)st < TM_ARRAY_LEN(names) ? names[st] : "?";
}

/* ---- HMAC-SHA256 ---- */

static EVP_MAC *auth_mac_alg(void)
{
    static EVP_MAC *alg;   /* fetched once; OpenSSL's fetch is thread-safe, a lost race leaks one */
    EVP_MAC *a = __atomic_load_n(&alg, __ATOMIC_ACQUIRE);
    if (!a) {
        a = EVP_MAC_fetch(NULL, "HMAC", NULL);
        EVP_MAC *expect = NULL;
        if (a && !__atomic_compare_exchange_n(&alg, &expect, a, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            EVP_MAC_free(a);
            a = expect;
        }
    }
    return a;
}

/* HMAC-SHA256 under key (nk bytes) of the concatenation of n parts, with ctx (a context that
 * is created on first use and kept in *ctxp). */
static bool auth_hmac(void **ctxp, const void *key, size_t nk, const void *const *parts, const size_t *sizes, int n,
                      uint8_t out[AUTH_MAC_SIZE])
{
    EVP_MAC_CTX *ctx = *ctxp;
    if (!ctx) {
        EVP_MAC *alg = auth_mac_alg();
        if (!alg || !(ctx = EVP_MAC_CTX_new(alg))) return false;
        *ctxp = ctx;
    }
    OSSL_PARAM params[] = { OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
                            OSSL_PARAM_construct_end() };
    if (!EVP_MAC_init(ctx, key, nk, params)) return false;
    for (int i = 0; i < n; i++)
        if (sizes[i] && !EVP_MAC_update(ctx, parts[i], sizes[i])) return false;
    size_t len = 0;
    return EVP_MAC_final(ctx, out, &len, AUTH_MAC_SIZE) && len == AUTH_MAC_SIZE;
}

/* HMAC(K, label | side | first nonce | second nonce): the proofs and the session keys. */
static bool auth_derive(const auth_key *k, const char *label, char side, const uint8_t *n1, const uint8_t *n2,
                        uint8_t out[AUTH_MAC_SIZE])
{
    void *ctx = NULL;
    uint8_t sb = (uint8_t)side;
    const void *parts[] = { label, &sb, n1, n2 };
    size_t sizes[] = { strlen(label), 1, AUTH_NONCE_SIZE, AUTH_NONCE_SIZE };
    bool ok = auth_hmac(&ctx, k->secret, k->n, parts, sizes, 4, out);
    EVP_MAC_CTX_free(ctx);
    return ok;
}

void auth_dir_free(auth_dir *d)
{
    EVP_MAC_CTX_free(d->mac);
    OPENSSL_cleanse(d, sizeof *d);
}

bool auth_dir_tag(auth_dir *d, const void *a, size_t na, const void *b, size_t nb, uint8_t tag[AUTH_TAG_SIZE])
{
    uint8_t seq[8], full[AUTH_MAC_SIZE];
    for (int i = 0; i < 8; i++) seq[i] = (uint8_t)(d->seq >> (8 * i));
    const void *parts[] = { seq, a, b };
    size_t sizes[] = { 8, na, nb };
    bool ok = auth_hmac(&d->mac, d->key, sizeof d->key, parts, sizes, 3, full);
    d->seq++;
    memcpy(tag, full, AUTH_TAG_SIZE);
    return ok;
}

/* ---- key files ---- */

auth_status auth_key_load(const char *path, auth_key *k, char *err, size_t errsz)
{
    memset(k, 0, sizeof *k);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        snprintf(err, errsz, "cluster key file %s: %s", path, strerror(errno));
        return AUTH_ERR_FILE;
    }
    struct stat sb;
    auth_status st = AUTH_ERR_FILE;
    if (fstat(fd, &sb)) {
        snprintf(err, errsz, "cluster key file %s: %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        snprintf(err, errsz, "cluster key file %s: not a regular file", path);
    } else if (sb.st_mode & (S_IROTH | S_IWOTH)) {
        snprintf(err, errsz, "cluster key file %s: readable or writable by other users (mode %03o): chmod 600 it",
                 path, (unsigned)(sb.st_mode & 0777));
    } else if (sb.st_size > AUTH_MAX_KEY) {
        snprintf(err, errsz, "cluster key file %s: %lld bytes, at most %d", path, (long long)sb.st_size, AUTH_MAX_KEY);
    } else {
        ssize_t n = read(fd, k->secret, sizeof k->secret);
        if (n < 0) {
            snprintf(err, errsz, "cluster key file %s: %s", path, strerror(errno));
        } else {
            while (n > 0 && (k->secret[n - 1] == '\n' || k->secret[n - 1] == '\r' || k->secret[n - 1] == ' ' ||
                             k->secret[n - 1] == '\t'))
                n--;
            k->n = (size_t)n;
            if (!k->n) snprintf(err, errsz, "cluster key file %s is empty", path);
            else st = AUTH_OK;
        }
    }
    close(fd);
    if (st == AUTH_OK && k->n < AUTH_MIN_KEY_WARN)
        log_warn("cluster key file %s: only %zu bytes; use 32 random bytes (openssl rand -hex 32)", path, k->n);
    if (st != AUTH_OK) OPENSSL_cleanse(k, sizeof *k);
    return st;
}

/* mkdir -p of path's directory, new parts mode 0700. */
static void auth_mkdirs(const char *path)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return;
    *slash = 0;
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(dir, 0700);
            *p = '/';
        }
    mkdir(dir, 0700);
}

auth_status auth_key_default(auth_key *k, char *path, size_t pathsz, char *err, size_t errsz)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(path, pathsz, "%s/tokenmill/cluster.key", xdg);
    else snprintf(path, pathsz, "%s/.cache/tokenmill/cluster.key", home && *home ? home : "/tmp");
    if (access(path, F_OK)) {
        /* written whole under a temporary name, then linked in: a process that loses the race
         * (link fails with EEXIST) reads the winner's key, never a half-written one */
        auth_mkdirs(path);
        uint8_t raw[32];
        char hex[65 + 1], tmp[4200];
        if (RAND_bytes(raw, sizeof raw) != 1) {
            snprintf(err, errsz, "cannot make a cluster key: no random bytes");
            return AUTH_ERR_CRYPTO;
        }
        util_hex(raw, sizeof raw, hex);
        hex[64] = '\n';
        hex[65] = 0;
        OPENSSL_cleanse(raw, sizeof raw);
        snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) {
            snprintf(err, errsz, "cannot create the cluster key %s: %s", tmp, strerror(errno));
            return AUTH_ERR_FILE;
        }
        bool ok = write(fd, hex, 65) == 65 && !fsync(fd);
        close(fd);
        OPENSSL_cleanse(hex, sizeof hex);
        if (ok && link(tmp, path) && errno != EEXIST) ok = false;
        int e = errno;
        unlink(tmp);
        if (!ok) {
            snprintf(err, errsz, "cannot create the cluster key %s: %s", path, strerror(e));
            return AUTH_ERR_FILE;
        }
    }
    return auth_key_load(path, k, err, errsz);
}

/* ---- handshake ---- */

/* The next handshake frame, which must be of type want; an ERROR from the peer (it refused
 * us) or anything else ends the handshake. */
static auth_status auth_expect(proto_conn *c, int want, proto_msg *m, char *why, size_t whysz)
{
    proto_status st = proto_recv(c, m);
    if (st != PROTO_OK) {
        if (st == PROTO_ERR_VERSION)   /* an older or newer build: say what to do about it */
            snprintf(why, whysz, "the peer speaks another protocol version (this build speaks %d): run the same "
                     "tokenmill release on the gateway and every worker", PROTO_VERSION);
        else
            snprintf(why, whysz, "%s", st == PROTO_ERR_CLOSED ? "connection closed during the handshake" : proto_status_name(st));
        return st == PROTO_ERR_CLOSED || st == PROTO_ERR_IO ? AUTH_ERR_IO : AUTH_ERR_PROTO;
    }
    if (m->hdr.type == want) return AUTH_OK;
    auth_status rc = AUTH_ERR_PROTO;
    if (m->hdr.type == PROTO_ERROR) {
        snprintf(why, whysz, "the peer refused the handshake: %s", m->u.error.msg ? m->u.error.msg : "");
        if (m->u.error.code == PROTO_E_AUTH) rc = AUTH_ERR_REFUSED;
    } else {
        snprintf(why, whysz, "%s before the handshake (the peer has no cluster key support)", proto_type_name(m->hdr.type));
    }
    proto_msg_free(m);
    return rc;
}

auth_status auth_handshake(proto_conn *c, const auth_key *k, auth_side side, char *why, size_t whysz)
{
    char peer_side = side == AUTH_SIDE_GATEWAY ? AUTH_SIDE_WORKER : AUTH_SIDE_GATEWAY;
    proto_msg m, r;
    memset(&m, 0, sizeof m);
    snprintf(why, whysz, "ok");
    if (c->sealed || !k || !k->n) {
        snprintf(why, whysz, "no cluster key");
        return AUTH_ERR_FILE;
    }
    uint8_t mine[AUTH_NONCE_SIZE], theirs[AUTH_NONCE_SIZE], want[AUTH_MAC_SIZE];
    if (RAND_bytes(mine, sizeof mine) != 1) {
        snprintf(why, whysz, "no random bytes for the nonce");
        return AUTH_ERR_CRYPTO;
    }
    /* 1. both sides send a fresh nonce */
    m.hdr.type = PROTO_CHALLENGE;
    memcpy(m.u.challenge.nonce, mine, sizeof mine);
    if (proto_send_msg(c, &m) != PROTO_OK) {
        snprintf(why, whysz, "cannot send CHALLENGE");
        return AUTH_ERR_IO;
    }
    auth_status st = auth_expect(c, PROTO_CHALLENGE, &r, why, whysz);
    if (st != AUTH_OK) return st;
    memcpy(theirs, r.u.challenge.nonce, sizeof theirs);
    if (!CRYPTO_memcmp(theirs, mine, sizeof mine)) {   /* our own nonce reflected back */
        snprintf(why, whysz, "the peer echoed our nonce");
        return AUTH_ERR_REFUSED;
    }
    /* 2. both sides prove the key over both nonces, each its own side first */
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_PROOF;
    if (!auth_derive(k, "TMCP-PROOF", (char)side, mine, theirs, m.u.proof.mac) ||
        !auth_derive(k, "TMCP-PROOF", peer_side, theirs, mine, want)) {
        snprintf(why, whysz, "HMAC failed");
        return AUTH_ERR_CRYPTO;
    }
    if (proto_send_msg(c, &m) != PROTO_OK) {
        snprintf(why, whysz, "cannot send PROOF");
        return AUTH_ERR_IO;
    }
    st = auth_expect(c, PROTO_PROOF, &r, why, whysz);
    if (st != AUTH_OK) return st;
    if (CRYPTO_memcmp(r.u.proof.mac, want, sizeof want)) {
        snprintf(why, whysz, "wrong proof: the peer does not hold this cluster key");
        memset(&m, 0, sizeof m);
        m.hdr.type = PROTO_ERROR;
        m.u.error.code = PROTO_E_AUTH;
        m.u.error.msg = (char *)"cluster key differs";
        (void)proto_send_msg(c, &m);
        return AUTH_ERR_REFUSED;
    }
    /* 3. one session key per direction; from here on every frame is tagged */
    if (!auth_derive(k, "TMCP-KEY", (char)side, mine, theirs, c->tx.key) ||
        !auth_derive(k, "TMCP-KEY", peer_side, theirs, mine, c->rx.key)) {
        snprintf(why, whysz, "HMAC failed");
        return AUTH_ERR_CRYPTO;
    }
    c->tx.seq = c->rx.seq = 0;
    c->sealed = true;
    OPENSSL_cleanse(want, sizeof want);
    return AUTH_OK;
}
