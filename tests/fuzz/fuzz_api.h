/*
 * fuzz_api: the request parser of one chat API (api_parse) on arbitrary bodies; included by
 * fuzz_api_chat.c, fuzz_api_responses.c and fuzz_api_messages.c, which set FUZZ_API_KIND, so
 * that each API grows a corpus of its own. A body is accepted or refused with an error that
 * names the offending field in the vendor's shape (api_error_json must write valid JSON);
 * nothing it contains may crash, hang or leak. The Messages target also runs the
 * count_tokens parser, Responses looks previous_response_id up in a (small) response store.
 */
#include "fuzz.h"

#include <jansson.h>

#include "recipe/api.h"

static api_store *store;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    store = api_store_new(4);
    return 0;
}

static void check_error(const api_error *e)
{
    bytebuf b = { 0 };
    api_error_json(FUZZ_API_KIND, e, &b);
    json_error_t jerr;
    json_t *v = json_loadb(b.p, b.len, 0, &jerr);
    if (!v || e->status < 400 || e->status > 599) {
        fprintf(stderr, "api: error %d is not valid JSON: %.*s\n", e->status, (int)b.len, b.p);
        abort();
    }
    json_decref(v);
    bytebuf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    api_cfg cfg = { .model_name = "stories260K", .model_alias = NULL, .store = store };
    api_req r;
    api_error e;
    api_req_init(&r, FUZZ_API_KIND);
    if (api_parse(&cfg, FUZZ_API_KIND, (const char *)data, size, &r, &e) != API_OK) check_error(&e);
    api_req_free(&r);
#if FUZZ_API_KIND == API_KIND_MESSAGES
    api_req_init(&r, FUZZ_API_KIND);
    if (api_messages_count_parse(&cfg, (const char *)data, size, &r, &e) != API_OK) check_error(&e);
    api_req_free(&r);
#endif
    return 0;
}
