/*
 * fuzz_proto: the cluster frame decoder on arbitrary bytes, as a peer on the cluster port
 * could send them. The input is read as a stream of frames, the way proto_recv reads a
 * connection: a header (proto_hdr_parse), then its payload (proto_decode), until a frame is
 * refused or the bytes run out. A frame that decodes is encoded again and must decode again
 * to the same bytes: what one end writes, the other accepts.
 */
#include "fuzz.h"

#include "cluster/proto.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    return 0;
}

static void roundtrip(const proto_msg *m)
{
    bytebuf b = { 0 };
    if (proto_encode(&b, m) != PROTO_OK) {
        /* a decoded frame is within every limit, so its encoding cannot be refused */
        fprintf(stderr, "proto: a decoded %s frame does not encode\n", proto_type_name(m->hdr.type));
        abort();
    }
    proto_hdr h;
    proto_msg again;
    if (proto_hdr_parse((const uint8_t *)b.p, b.len, &h) != PROTO_OK || b.len != PROTO_HDR_SIZE + (size_t)h.len ||
        proto_decode(&h, (const uint8_t *)b.p + PROTO_HDR_SIZE, &again) != PROTO_OK) {
        fprintf(stderr, "proto: the encoding of a decoded %s frame does not decode\n", proto_type_name(m->hdr.type));
        abort();
    }
    bytebuf b2 = { 0 };
    if (proto_encode(&b2, &again) != PROTO_OK || b2.len != b.len || memcmp(b2.p, b.p, b.len)) {
        fprintf(stderr, "proto: a %s frame changes through decode and encode\n", proto_type_name(m->hdr.type));
        abort();
    }
    proto_msg_free(&again);
    bytebuf_free(&b2);
    bytebuf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    while (size >= PROTO_HDR_SIZE) {
        proto_hdr h;
        if (proto_hdr_parse(data, size, &h) != PROTO_OK) break;
        if (size - PROTO_HDR_SIZE < h.len) break;
        /* the payload in a buffer of its own size, so ASan sees any read past it */
        uint8_t *payload = malloc(h.len ? h.len : 1);
        memcpy(payload, data + PROTO_HDR_SIZE, h.len);
        proto_msg m;
        proto_status st = proto_decode(&h, payload, &m);
        free(payload);
        if (st != PROTO_OK) break;
        roundtrip(&m);
        proto_msg_free(&m);
        data += PROTO_HDR_SIZE + h.len;
        size -= PROTO_HDR_SIZE + h.len;
    }
    return 0;
}
