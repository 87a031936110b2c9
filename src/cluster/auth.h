/*
 * auth: the cluster secret, the handshake that proves it, and the tags of the frames after it
 * (docs/protocol.md, "Authentication").
 *
 * DESIGN. The gateway and its workers share a secret K: the bytes of a key file
 * (--cluster-key-file, or one generated into the cache dir). Before any other frame, each side
 * of a connection sends CHALLENGE with 32 fresh random bytes (its nonce), then PROOF =
 * HMAC-SHA256(K, "TMCP-PROOF" | side | own nonce | peer nonce), side being 'G' for the gateway
 * and 'W' for a worker, and checks the peer's PROOF (in constant time) before it accepts
 * anything else. Both nonces are new on every connection, so a recorded handshake proves
 * nothing on another one, and the side byte keeps one side from being used to compute the
 * other's proof. The handshake then derives one session key per direction, HMAC-SHA256(K,
 * "TMCP-KEY" | side of the sender | sender's nonce | receiver's nonce); every later frame
 * carries a 16-byte tag, the first bytes of HMAC-SHA256(session key, u64 seq | header |
 * payload), seq counting that direction's frames from 0. The count is implicit (TCP keeps the
 * order), so a replayed, reordered, dropped or altered frame fails its check. Nothing is
 * encrypted: the protocol proves who speaks and that nothing was changed, it hides nothing.
 *
 * An auth_dir is one direction's tagging state; it belongs to one thread at a time (a
 * connection's writers hold its send lock, its reader alone reads).
 */
#ifndef TM_AUTH_H
#define TM_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AUTH_NONCE_SIZE 32      /* bytes of a CHALLENGE nonce */
#define AUTH_MAC_SIZE 32        /* bytes of HMAC-SHA256: PROOF and session keys */
#define AUTH_TAG_SIZE 16        /* bytes of the tag after every frame of a sealed connection */
#define AUTH_MAX_KEY 4096       /* longest key file, bytes */
#define AUTH_MIN_KEY_WARN 16    /* shorter keys work but are warned about */

typedef enum {
    AUTH_OK = 0,
    AUTH_ERR_FILE,          /* key file missing, unreadable, empty, too big, not private */
    AUTH_ERR_REFUSED,       /* the peer does not hold the key (bad PROOF), or refused ours */
    AUTH_ERR_PROTO,         /* the peer did not do the handshake (another frame, version) */
    AUTH_ERR_IO,            /* connection closed, timed out or failed */
    AUTH_ERR_CRYPTO,        /* OpenSSL failed (random bytes, HMAC) */
} auth_status;

typedef enum {
    AUTH_SIDE_GATEWAY = 'G',
    AUTH_SIDE_WORKER = 'W',
} auth_side;

typedef struct {
    uint8_t secret[AUTH_MAX_KEY]; /* (n) bytes of the key file, trailing whitespace stripped */
    size_t n;
} auth_key;

typedef struct {
    void *mac;                  /* EVP_MAC_CTX for HMAC-SHA256, NULL until keyed */
    uint8_t key[AUTH_MAC_SIZE]; /* this direction's session key */
    uint64_t seq;               /* frames tagged (sender) / checked (receiver) so far */
} auth_dir;

struct proto_conn;

const char *auth_status_name(auth_status st);

/* Reads the key at path. Refused (AUTH_ERR_FILE, err says why): not a regular file, readable
 * or writable by others (o+r / o+w: the secret would not be one), empty (after trailing
 * whitespace, which is stripped so that `echo`ed and copied keys match), or above
 * AUTH_MAX_KEY. A key shorter than AUTH_MIN_KEY_WARN bytes is accepted with a warning. */
auth_status auth_key_load(const char *path, auth_key *k, char *err, size_t errsz);
/* The key when no file is named: PATH = $XDG_CACHE_HOME/tokenmill/cluster.key (else
 * $HOME/.cache/tokenmill/cluster.key), created with 32 random bytes (hex, mode 0600, its dir
 * 0700) when absent, atomically, so that processes started together agree on one key; then
 * auth_key_load. path (pathsz bytes) receives PATH. */
auth_status auth_key_default(auth_key *k, char *path, size_t pathsz, char *err, size_t errsz);

void auth_dir_free(auth_dir *d);
/* The tag of the next frame of this direction (a: header, b: payload), seq then counts it.
 * False when OpenSSL fails. */
bool auth_dir_tag(auth_dir *d, const void *a, size_t na, const void *b, size_t nb, uint8_t tag[AUTH_TAG_SIZE]);

/* Runs the handshake on a fresh connection (c unsealed; the caller bounds the whole of it with
 * c->deadline: a receive timeout would restart with each byte a stranger trickles in). On AUTH_OK c is sealed: every later frame is tagged and checked.
 * Otherwise why says what happened (for the log line) and, when the peer's proof was wrong,
 * ERROR AUTH has been sent to it. */
auth_status auth_handshake(struct proto_conn *c, const auth_key *k, auth_side side, char *why, size_t whysz);

#endif
