/*
 * greet: the table of connections still in their handshake, on a port strangers can reach (the
 * gateway's registration port, a worker's --listen port). The gateway and the workers share it
 * so that both bound the same way what a peer without the cluster key can hold.
 *
 * DESIGN. Each accepted connection takes an entry until its handshake ends; the handshake itself
 * runs under an absolute deadline (proto_conn.deadline, GREET_DEADLINE_S by default), so an
 * entry is held for a bounded time however slowly its bytes trickle in. When every entry is
 * taken a new connection is not refused: it evicts the oldest handshake of the source address
 * holding the most entries (that connection is shut down; its thread sees the failure and
 * leaves). A stranger therefore cannot keep a worker out by holding the entries: each new
 * connection, the worker's included, gets one, and one flooding from one address evicts its own
 * connections before anyone else's. Eviction is not refusal, so the threads that run the
 * evicted handshakes still exist for a moment: greet_add refuses (-1) only when that many
 * threads again are still running (greet_max_threads).
 *
 * Not thread-safe: the owner calls every function under its own lock. An entry's fd belongs to
 * the thread running its handshake, which removes the entry (under that lock) before closing
 * the fd, so an eviction never shuts down a descriptor reused by another connection.
 */
#ifndef TM_GREET_H
#define TM_GREET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GREET_MAX 32              /* handshakes in progress at once, per port */
#define GREET_DEADLINE_S 5.0      /* default: longest a whole handshake may take, seconds */
#define GREET_HOST_MAX 64         /* bytes of a source address kept (numeric, NUL included) */

typedef struct {
    int n_max;                    /* entries in use at most, 1..GREET_MAX */
    int fd[GREET_MAX];            /* the connection in its handshake, -1 free */
    uint64_t ticket[GREET_MAX];   /* its entry's ticket (0 free): removal names it */
    double t0[GREET_MAX];         /* util_now() it was accepted */
    char host[GREET_MAX][GREET_HOST_MAX]; /* its source address */
    uint64_t next_ticket;
    int n_threads;                /* the owner's handshake threads still running */
    uint64_t n_evicted;           /* lifetime: handshakes cut to make room */
} greet_table;

/* An empty table of n_max entries (<= 0 or above GREET_MAX: GREET_MAX). */
void greet_init(greet_table *t, int n_max);
/* Takes an entry for fd (from host; NULL or "" is one unknown address) and counts its thread:
 * the ticket the thread gives back to greet_done, or 0 when too many handshake threads still run
 * (the caller closes fd). When the table was full, *evicted receives the descriptor that was
 * shut down to make room (else -1), for the caller's log. */
uint64_t greet_add(greet_table *t, int fd, const char *host, int *evicted);
/* The handshake of ticket ended (well or not): its entry is freed (when it was not evicted). The
 * caller closes or keeps the fd after this. */
void greet_done(greet_table *t, uint64_t ticket);
/* The thread of a handshake leaves (after greet_done; the last thing it does under the lock). */
void greet_leave(greet_table *t);
/* Every handshake in progress fails now (shutdown of each fd), for the owner's stop. */
void greet_shutdown_all(greet_table *t);
/* Most handshake threads at once: the entries plus as many evicted ones finishing. */
static inline int greet_max_threads(const greet_table *t) { return 2 * t->n_max; }

#endif
