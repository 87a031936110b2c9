/*
 * fuzz_serve: the four generating routes end to end in one process, as `tokenmill serve` runs
 * them: the HTTP server (127.0.0.1, a free port) with the completions, chat, responses and
 * messages routes over models/stories260K.gguf and its plain template, and a backend that
 * stands in for the scheduler: it "generates" the request's own prompt ids again (at most
 * ECHO_MAX of them, with made-up log-probs), ending with LENGTH or at a stop id, so the
 * output path (detokenizer, stop strings, logprobs, the SSE writers) runs on every accepted
 * request. This is the target for POST /v1/completions, whose parser lives in its route.
 *
 * Input: byte 0 picks the route (completions, chat, responses, messages, count_tokens), the
 * rest is the body. The harness sends one request per input on a fresh connection and reads
 * the answer to the end; a server that does not answer with an HTTP status line within
 * REPLY_TIMEOUT_S is a hang, and a 5xx status is a failure (the backend never fails, so every
 * request is answered 2xx or 4xx).
 */
#include "fuzz.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "http/http.h"
#include "model/gguf.h"
#include "model/model.h"
#include "recipe/api.h"
#include "recipe/template.h"
#include "recipe/tokenizer.h"

#define MODEL "models/stories260K.gguf"
#define ECHO_MAX 12          /* tokens a request "generates" at most */
#define N_CTX 512            /* positions per sequence the routes check against */
#define REPLY_TIMEOUT_S 30

static const char *const routes[] = {
    "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens",
};

/* ---- the stand-in backend ---- */
typedef struct {
    int32_t ids[ECHO_MAX];     /* what it will generate */
    int n;                     /* of ids */
    int next;                  /* next id to emit; n: FINISH next; n + 1: done */
    bool stopped;              /* the last id is a stop id */
    int n_prompt;
    int top;                   /* alternatives per token */
    bool logprobs;
} echo_req;

static sched_status echo_submit(void *ud, const sched_params *p, sched_req **out)
{
    if (p->n_prompt < 1) return SCHED_ERR_ARG;
    if (p->n_prompt >= N_CTX) return SCHED_ERR_TOO_LONG;
    echo_req *e = xcalloc(1, sizeof *e);
    int max = p->max_tokens > 0 ? p->max_tokens : N_CTX - p->n_prompt;
    for (int i = 0; i < ECHO_MAX && i < max && i < N_CTX - p->n_prompt; i++) {
        e->ids[e->n++] = p->prompt[i % p->n_prompt];
        for (int k = 0; k < p->n_stop_ids; k++) e->stopped |= p->prompt[i % p->n_prompt] == p->stop_ids[k];
        if (e->stopped) break;
    }
    e->n_prompt = p->n_prompt;
    e->logprobs = p->logprobs;
    e->top = p->top_logprobs;
    *out = (sched_req *)e;
    return SCHED_OK;
}

static int echo_poll(void *ud, sched_req *r, sched_output *out, int max, int timeout_ms)
{
    echo_req *e = (echo_req *)r;
    int k = 0;
    while (k < max && e->next <= e->n) {
        sched_output *o = &out[k++];
        memset(o, 0, sizeof *o);
        o->usage.prompt_tokens = e->n_prompt;
        if (e->next < e->n) {
            o->kind = SCHED_OUT_TOKEN;
            o->token = e->ids[e->next];
            o->is_stop = e->stopped && e->next == e->n - 1;
            o->logprob = e->logprobs ? -0.5f * (float)e->next : 0;
            o->n_top = e->top;
            for (int i = 0; i < e->top; i++) o->top[i] = (sched_logprob){ e->ids[(e->next + i) % e->n], -(float)i };
        } else {
            o->kind = SCHED_OUT_FINISH;
            o->finish = e->stopped ? SCHED_FINISH_STOP : SCHED_FINISH_LENGTH;
            o->usage.completion_tokens = e->n;
            o->ttft_s = 0.001;
        }
        e->next++;
    }
    return k;
}

static void echo_cancel(void *ud, sched_req *r) { ((echo_req *)r)->next = ((echo_req *)r)->n; }
static void echo_release(void *ud, sched_req *r) { free(r); }

static const api_backend echo_backend = {
    .submit = echo_submit, .poll = echo_poll, .cancel = echo_cancel, .release = echo_release,
};

/* ---- the server, made once ---- */
static model *mdl;
static gguf *g;
static tokenizer *tok;
static template *tmpl;
static api_ctx ctx;
static http_server *srv;
static int port;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    char err[256];
    if (model_load(MODEL, NULL, &mdl, err, sizeof err) != GGUF_OK) fuzz_die(MODEL, err);
    if (gguf_open(MODEL, &g, err, sizeof err) != GGUF_OK || tokenizer_load(g, &tok, err, sizeof err) != TOKENIZER_OK ||
        template_new(tok, g, NULL, &tmpl, err, sizeof err) != TEMPLATE_OK)
        fuzz_die(MODEL, err);
    ctx = (api_ctx){
        .model = mdl, .tok = tok, .tmpl = tmpl, .model_name = "stories260K", .n_ctx = N_CTX,
        .backend = &echo_backend,
    };
    http_opts o = { .host = "127.0.0.1", .port = 0, .max_body = 1 << 20, .idle_timeout_s = REPLY_TIMEOUT_S };
    if (http_server_new(&o, &srv, err, sizeof err) != HTTP_OK) fuzz_die("http_server_new", err);
    api_completions_register(srv, &ctx);
    api_chat_register(srv, &ctx);
    api_responses_register(srv, &ctx);
    api_messages_register(srv, &ctx);
    if (http_server_start(srv, err, sizeof err) != HTTP_OK) fuzz_die("http_server_start", err);
    port = http_server_port(srv);
    return 0;
}

static void send_all(int fd, const void *p, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;   /* libFuzzer's timeout alarm */
        if (k <= 0) return;   /* the server may answer (413, 400) before reading it all */
        p = (const char *)p + k;
        n -= (size_t)k;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const char *path = routes[data[0] % (sizeof routes / sizeof routes[0])];
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = { .tv_sec = REPLY_TIMEOUT_S };
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 100; tries++) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) fuzz_die("socket", strerror(errno));
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) break;
        if (errno != EINTR) fuzz_die("connect", strerror(errno));
        close(fd);   /* interrupted by libFuzzer's timeout alarm: a fresh socket */
        fd = -1;
    }
    if (fd < 0) fuzz_die("connect", "interrupted 100 times");
    char head[256];
    int hn = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n", path, size - 1);
    send_all(fd, head, (size_t)hn);
    send_all(fd, data + 1, size - 1);
    char buf[4096], first[16] = "";
    size_t n_first = 0;
    int err = 0;
    for (;;) {
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k < 0 && errno == EINTR) continue;   /* libFuzzer's timeout alarm */
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) fuzz_die("no answer within the timeout", path);
        if (k < 0) err = errno;
        if (k <= 0) break;
        for (ssize_t i = 0; i < k && n_first < sizeof first - 1; i++) first[n_first++] = buf[i];
    }
    close(fd);
    if (strncmp(first, "HTTP/1.1 ", 9) != 0) {
        fprintf(stderr, "fuzz_serve: %s answered %zu bytes (%s)\n", path, n_first, err ? strerror(err) : "closed");
        fuzz_die("no HTTP status line in the answer", path);
    }
    /* the stand-in backend never fails, so a 5xx is the server's own fault */
    if (first[9] == '5') fuzz_die("a 5xx answer to a request", first);
    return 0;
}
