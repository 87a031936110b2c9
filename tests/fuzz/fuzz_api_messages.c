/* fuzz_api_messages: the request parser of POST /v1/messages (see fuzz_api.h). */
#define FUZZ_API_KIND API_KIND_MESSAGES
#include "fuzz_api.h"
