/* fuzz_api_responses: the request parser of POST /v1/responses (see fuzz_api.h). */
#define FUZZ_API_KIND API_KIND_RESPONSES
#include "fuzz_api.h"
