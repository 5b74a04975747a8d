/* sample.c - zs-train-gpt's text sampler (sample.h): the logits' cuts and penalty, the draw, and the printed
 * text. Nothing here depends on the rank or the world size, so every rank generates the same bytes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../splitmix.h" /* defines: ex_splitmix64 */
#include "sample.h"
#include "zeroshard.h" /* defines: ZS_ERR_NOMEM */

#define NBYTES 256

static double uniform01(uint64_t seed, uint64_t i)
{
    return (double)(ex_splitmix64((seed - 1) * 0x9e3779b97f4a7c15ULL + i) >> 11) * (1.0 / 9007199254740992.0);
}

/* Top-k: zeroes the weight of every byte outside the k likeliest (ties go to the lower byte, so the set is
 * always exactly k). The rare tail is where a small model's misspellings come from. */
static void keep_top_k(const float *z, double *p, int64_t k)
{
    for (int c = 0; c < NBYTES && k > 0 && k < NBYTES; c++) {
        int64_t above = 0;
        for (int d = 0; d < NBYTES; d++)
            above += z[d] > z[c] || (z[d] == z[c] && d < c);
        if (above >= k)
            p[c] = 0;
    }
}

/* Top-p (nucleus): keeps the likeliest bytes, in top-k's order, until their share of the weight reaches
 * top_p, and zeroes the rest; the likeliest byte always stays. A cut that adapts to the model's certainty:
 * after "th" few bytes are kept, after a space many. */
static void keep_top_p(const float *z, double *p, double top_p)
{
    double total = 0, kept = 0;
    int order[NBYTES];

    if (top_p >= 1)
        return;
    for (int c = 0; c < NBYTES; c++) {
        int above = 0;
        for (int d = 0; d < NBYTES; d++)
            above += z[d] > z[c] || (z[d] == z[c] && d < c);
        order[above] = c;
        total += p[c];
    }
    int k = 0;
    while (k < NBYTES && (k == 0 || kept < top_p * total))
        kept += p[order[k++]];
    for (; k < NBYTES; k++)
        p[order[k]] = 0;
}

/* Whitespace counts as one byte for the penalty: a sample must not collapse into blank space of any mix. */
static int is_space(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Whether byte c belongs to the run that ends the text: the same byte as the last, or, when the last is
 * whitespace, any whitespace. */
static int in_run(uint8_t last, uint8_t c)
{
    return c == last || (is_space(last) && is_space(c));
}

/* The repetition penalty: the run that ends the text (one byte repeated, or whitespace of any mix), r bytes
 * long, costs each of its bytes penalty * (r / window)^2 times the logits' spread plus one (max - min + 1)
 * from its logit; no other byte changes. A run of one or two costs little, so doubled letters, line breaks
 * and short indents survive, while a run that reaches the window with a penalty above 1 puts each of its
 * bytes strictly below the least likely other byte: z - penalty * (max - min + 1) < min (the +1 splits
 * equal logits too). Their weights are then each below 1/250 of the total and last in top-k's and top-p's
 * order, so top-k under 250 or top-p under 249/256 cuts them, and even with every byte kept each further
 * byte of the run has a chance under 6/256 that shrinks as the penalty grows: no run goes on for ever,
 * whatever the model. Counted over the whole text (prompt included), so a prompt that is an earlier
 * sample's beginning still continues it byte for byte. */
static void penalize_run(const struct gpt_sampler *s, const uint8_t *text, int64_t n, float *z)
{
    uint8_t last = text[n - 1];
    int64_t run = 0;
    float mx = z[0], mn = z[0];

    if (s->repetition_penalty <= 0)
        return;
    while (run < n && in_run(last, text[n - 1 - run]))
        run++;
    for (int c = 1; c < NBYTES; c++) {
        mx = z[c] > mx ? z[c] : mx;
        mn = z[c] < mn ? z[c] : mn;
    }
    double f = (double)run / (double)s->repetition_window;
    double cut = s->repetition_penalty * f * f * ((double)mx - (double)mn + 1.0);
    for (int c = 0; c < NBYTES; c++)
        if (in_run(last, (uint8_t)c))
            z[c] = (float)((double)z[c] - cut);
}

/* The byte after text[0..n) from the model's logits: penalty, temperature, cuts, then the uniform draw
 * indexed by n (the byte's position in the text). */
static uint8_t pick_byte(const struct gpt_sampler *s, const uint8_t *text, int64_t n, const float *logits)
{
    float z[NBYTES];
    double p[NBYTES], mx, sum = 0, acc = 0, u = uniform01(s->seed, (uint64_t)n);

    memcpy(z, logits, sizeof(z));
    penalize_run(s, text, n, z);
    mx = z[0];
    for (int c = 1; c < NBYTES; c++)
        mx = z[c] > mx ? z[c] : mx;
    for (int c = 0; c < NBYTES; c++)
        p[c] = exp(((double)z[c] - mx) / s->temperature);
    keep_top_k(z, p, s->top_k);
    keep_top_p(z, p, s->top_p);
    for (int c = 0; c < NBYTES; c++)
        sum += p[c];
    for (int c = 0; c < NBYTES; c++)
        if ((acc += p[c] / sum) > u)
            return (uint8_t)c;
    return NBYTES - 1;
}

/* Bytes other than printable ASCII, newline and tab (the fortunes indent their attributions with tabs)
 * are shown as '?'. */
static void print_byte(uint8_t c)
{
    putchar(c == '\n' || c == '\t' || (c >= 32 && c < 127) ? c : '?');
}

static void print_sample(const struct gpt_sampler *s, const uint8_t *text, int64_t n, int prompted)
{
    printf("sample (%lld bytes, temperature %g, top-k %lld, top-p %g, repetition penalty %g window %lld, seed "
           "%llu%s):\n",
           (long long)s->length, s->temperature, (long long)(s->top_k ? s->top_k : NBYTES), s->top_p,
           s->repetition_penalty, (long long)s->repetition_window, (unsigned long long)s->seed,
           prompted ? ", after the prompt" : "");
    for (int64_t i = 1; i < n; i++)
        print_byte(text[i]);
    printf("\n--- end of sample\n");
}

int gpt_sample_text(const struct gpt_sampler *s, gpt_next_logits next, void *arg, int32_t *in, int print)
{
    int64_t T = s->ctx, plen = (int64_t)strlen(s->prompt), n = 1 + plen;
    uint8_t *text = calloc((size_t)(s->length + n), 1);
    const float *z;
    int rc = 0;

    if (!text)
        return (int)ZS_ERR_NOMEM;
    text[0] = '\n';
    memcpy(text + 1, s->prompt, (size_t)plen);
    for (int64_t i = 0; i < s->length; i++, n++) {
        int64_t start = n > T ? n - T : 0, len = n - start;
        for (int64_t t = 0; t < T; t++)
            in[t] = t < len ? text[start + t] : 0;
        if ((rc = next(arg, in, len, &z)))
            goto out_free_text;
        text[n] = pick_byte(s, text, n, z);
    }
    if (print)
        print_sample(s, text, n, plen > 0);
out_free_text:
    free(text);
    return rc;
}
