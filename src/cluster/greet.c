/*
 * greet: handshakes in progress on a cluster port, bounded in number and time, and never held
 * by strangers at the expense of a worker (see greet.h).
 */
#include "cluster/greet.h"

#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "util/util.h"

void greet_init(greet_table *t, int n_max)
{
    memset(t, 0, sizeof *t);
    t->n_max = n_max > 0 && n_max <= GREET_MAX ? n_max : GREET_MAX;
    for (int i = 0; i < GREET_MAX; i++) t->fd[i] = -1;
}

/* The entry to evict from a full table: the oldest one of the address holding the most. */
static int greet_victim(const greet_table *t)
{
    int best = -1, best_n = 0;
    for (int i = 0; i < t->n_max; i++) {
        int n = 0;
        for (int k = 0; k < t->n_max; k++) n += !strcmp(t->host[k], t->host[i]);
        if (n > best_n || (n == best_n && t->t0[i] < t->t0[best])) {
            best = i;
            best_n = n;
        }
    }
    return best;
}

uint64_t greet_add(greet_table *t, int fd, const char *host, int *evicted)
{
    *evicted = -1;
    if (t->n_threads >= greet_max_threads(t)) return 0;
    int i = -1;
    for (int k = 0; k < t->n_max && i < 0; k++)
        if (!t->ticket[k]) i = k;
    if (i < 0) {
        i = greet_victim(t);
        *evicted = t->fd[i];
        shutdown(t->fd[i], SHUT_RDWR);   /* its thread's next read fails; it frees nothing here */
        t->n_evicted++;
    }
    t->fd[i] = fd;
    t->ticket[i] = ++t->next_ticket;
    t->t0[i] = util_now();
    snprintf(t->host[i], sizeof t->host[i], "%s", host ? host : "");
    t->n_threads++;
    return t->ticket[i];
}

void greet_done(greet_table *t, uint64_t ticket)
{
    for (int i = 0; i < t->n_max; i++)
        if (t->ticket[i] == ticket) {
            t->ticket[i] = 0;
            t->fd[i] = -1;
            t->host[i][0] = 0;
        }
}

void greet_leave(greet_table *t)
{
    if (t->n_threads > 0) t->n_threads--;
}

void greet_shutdown_all(greet_table *t)
{
    for (int i = 0; i < t->n_max; i++)
        if (t->ticket[i]) shutdown(t->fd[i], SHUT_RDWR);
}
