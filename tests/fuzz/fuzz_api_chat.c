/* fuzz_api_chat: the request parser of POST /v1/chat/completions (see fuzz_api.h). */
#define FUZZ_API_KIND API_KIND_CHAT
#include "fuzz_api.h"
