/* sample.h - zs-train-gpt's text sampler: temperature, top-k, top-p and a repetition penalty on the run that
 * ends the text (one byte, or whitespace of any mix); each byte drawn from a uniform number indexed by its
 * position in the text. */
#ifndef GPT_SAMPLE_H
#define GPT_SAMPLE_H

#include <stdint.h>

struct gpt_sampler {
    int64_t ctx;    /* the model's context: the last ctx bytes predict the next */
    int64_t length; /* bytes to generate */
    double temperature;
    int64_t top_k; /* 0: all 256 bytes */
    double top_p;  /* 1: all */
    double repetition_penalty; /* 0: off; above 1 a run (one byte, or whitespace) past repetition_window
                                * bytes becomes the least likely */
    int64_t repetition_window;
    uint64_t seed;
    const char *prompt; /* printed before the sample and continued by it; "" for none */
};

/* The model's next-byte logits: in holds ctx bytes (zero after the first len), *z receives the 256 logits
 * after in[len - 1]. 0 or the failure. */
typedef int (*gpt_next_logits)(void *arg, const int32_t *in, int64_t len, const float **z);

/* Generates s->length bytes after a newline and the prompt, every rank alike (next may be collective);
 * when print, writes a header line, the prompt and the bytes generated, then an end line. in: ctx int32
 * scratch. 0, ZS_ERR_NOMEM or next's failure. */
int gpt_sample_text(const struct gpt_sampler *s, gpt_next_logits next, void *arg, int32_t *in, int print);

#endif /* GPT_SAMPLE_H */
