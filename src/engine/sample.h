/*
 * sample: choosing the next token from logits, the way llama.cpp's default sampler chain
 * does: repetition/presence/frequency penalties over a window of recent tokens, then top-k,
 * top-p, min-p, temperature, and a seeded draw. Temperature <= 0 is greedy (argmax after the
 * penalties; the lowest id wins a tie).
 *
 * A sampler owns its candidate buffers (n_vocab entries) and the penalty window, allocated
 * once in sample_new, so sample_token allocates nothing. The draw uses util_rng
 * (xoshiro256**) seeded from the params: the same seed, logits and history give the same
 * token on every run (llama.cpp uses a different generator, so sampled, non-greedy text is
 * not expected to equal llama.cpp's).
 */
#ifndef TM_SAMPLE_H
#define TM_SAMPLE_H

#include <stdint.h>
#include <stdbool.h>

/* Entries of a logit bias (OpenAI's logit_bias: token id -> a bias in [-100, 100]). */
#define SAMPLE_MAX_BIAS 128

typedef struct {
    float temp;               /* <= 0: greedy */
    int top_k;                /* <= 0: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off */
    float repeat_penalty;     /* 1: off; logit > 0 divided by it, logit <= 0 multiplied */
    float presence_penalty;   /* subtracted once from every token in the window */
    float frequency_penalty;  /* subtracted per occurrence in the window */
    int penalty_last_n;       /* window length in tokens; 0: no penalties */
    uint64_t seed;
    int n_bias;               /* entries of bias_id/bias, 0..SAMPLE_MAX_BIAS */
    int32_t bias_id[SAMPLE_MAX_BIAS]; /* token ids (ids outside the vocabulary are ignored) */
    float bias[SAMPLE_MAX_BIAS];      /* added to that token's logit before everything else:
                                       * -100 bans it, +100 all but forces it */
} sample_params;

typedef struct sampler sampler;

/* llama.cpp's defaults: temp 0.8, top-k 40, top-p 0.95, min-p 0.05, penalties off (1, 0, 0),
 * window 64, seed 0. */
sample_params sample_params_default(void);

sampler *sample_new(int n_vocab, const sample_params *params);
void sample_free(sampler *s);
/* Forgets the token history and reseeds the generator from params.seed. */
void sample_reset(sampler *s);
/* Appends a token (prompt or generated) to the penalty window. */
void sample_accept(sampler *s, int32_t token);
/* Advances the generator by n draws, as n non-greedy sample_token calls would (continuing a
 * request sampled elsewhere: cluster/worker.c). */
void sample_skip_draws(sampler *s, int n);
/* Picks the next token from logits (n_vocab floats, not modified). */
int32_t sample_token(sampler *s, const float *logits);

#endif
