/* data.h - the byte-level corpus, its fixed train/validation split, and the deterministic batches. */
#ifndef GPT_DATA_H
#define GPT_DATA_H

#include <stdint.h>

#define GPT_DEFAULT_CORPUS "/usr/share/games/fortunes"

struct gpt_data {
    uint8_t *bytes;
    int64_t len, train_len;  /* train: [0, train_len); validation: [train_len, len) */
    int32_t files;
};

/* path: a file, or a directory whose regular files (recursively, sorted by path) are concatenated; NULL:
 * the default corpus (fortunes' text files, not its .dat/.u8 indexes). 0, or -1 with a message in err. */
int gpt_data_load(struct gpt_data *d, const char *path, int64_t ctx, char *err, int errlen);
void gpt_data_free(struct gpt_data *d);
/* The byte unigram entropy of the whole corpus, in nats. */
double gpt_data_entropy(const struct gpt_data *d);
/* Inputs and targets of `count` sequences of ctx bytes: training sequence `first + i` of step `step`, or
 * (step < 0) validation sequence `first + i`. */
void gpt_data_batch(const struct gpt_data *d, uint64_t seed, int64_t step, int64_t first, int64_t count, int64_t ctx,
                    int32_t *in, int32_t *targets);

#endif /* GPT_DATA_H */
