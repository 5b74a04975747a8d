/* test_gpt_sample.c - zs-train-gpt's sampler (examples/gpt/sample.c) on made-up logits: a model that wants
 * nothing but one byte, or nothing but whitespace of two kinds, still never samples a run longer than the
 * repetition window; with the penalty off the same logits do collapse (so the checks can fail). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "sample.h"

#define LEN 3000

/* The fake model: high logits for the bytes in `want`, 0 for the rest; records the text it was shown. */
struct fake {
    const char *want;
    uint8_t text[LEN + 2];
    int64_t n;
};

static int fake_next(void *arg, const int32_t *in, int64_t len, const float **z)
{
    static float logits[256];
    struct fake *f = arg;

    f->text[f->n++] = (uint8_t)in[len - 1]; /* the byte just sampled (the first call: the start's newline) */
    for (int c = 0; c < 256; c++)
        logits[c] = strchr(f->want, c) && c ? 12.0f : 0.0f;
    *z = logits;
    return 0;
}

static int is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* The longest run of one byte, and of whitespace of any mix, in what the model was shown. */
static void runs(const struct fake *f, int64_t *same, int64_t *space)
{
    int64_t a = 0, b = 0;

    *same = *space = 0;
    for (int64_t i = 0; i < f->n; i++) {
        a = i > 0 && f->text[i] == f->text[i - 1] ? a + 1 : 1;
        b = is_space(f->text[i]) ? b + 1 : 0;
        *same = a > *same ? a : *same;
        *space = b > *space ? b : *space;
    }
}

static void sample(struct fake *f, const char *want, double penalty, double top_p)
{
    struct gpt_sampler s = {.ctx = 1, .length = LEN, .temperature = 0.7, .top_k = 0, .top_p = top_p,
                            .repetition_penalty = penalty, .repetition_window = 16, .seed = 1, .prompt = ""};
    int32_t in[1];

    memset(f, 0, sizeof(*f));
    f->want = want;
    CHECK(gpt_sample_text(&s, fake_next, f, in, 0) == 0, "gpt_sample_text failed");
}

int main(void)
{
    static struct fake f;
    int64_t same, space;

    sample(&f, "-", 0, 0.8); /* the penalty off: the model's one byte for ever */
    runs(&f, &same, &space);
    CHECK(same >= LEN - 1, "penalty off: the longest run of '-' is %lld, expected the whole sample", (long long)same);
    sample(&f, "-", 1.5, 0.8);
    runs(&f, &same, &space);
    CHECK(same <= 16, "one byte: a run of %lld, longer than the window (16)", (long long)same);
    sample(&f, "-", 1.5, 1.0); /* every byte kept: each byte past the window has a small chance */
    runs(&f, &same, &space);
    CHECK(same <= 24, "one byte, top-p 1: a run of %lld", (long long)same);

    sample(&f, " \n", 0, 0.8); /* the penalty off: blank space for ever */
    runs(&f, &same, &space);
    CHECK(space >= LEN - 1, "penalty off: the longest whitespace run is %lld", (long long)space);
    sample(&f, " \n", 1.5, 0.8); /* two kinds of whitespace: each alone stays short, the mix must too */
    runs(&f, &same, &space);
    CHECK(space <= 16, "whitespace of two kinds: a run of %lld, longer than the window (16)", (long long)space);
    sample(&f, " \n", 1.5, 1.0);
    runs(&f, &same, &space);
    CHECK(space <= 24, "whitespace, top-p 1: a run of %lld", (long long)space);
    return zs_test_summary("gpt_sample");
}
