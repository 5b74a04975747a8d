/* model_decl.h - the passes' types and functions for one element type; model.h includes it twice, with
 * GPT_REAL float and suffix _f32, and with GPT_REAL double and suffix _f64. No include guard on purpose. */

/* How the passes reach a unit's parameters and hand its gradient over. Each returns 0 or a non-zero code
 * that the pass returns at once. */
struct GPT_SUF(gpt_io) {
    void *arg;
    /* the unit's parameters, laid out as gpt_layout says, valid until release */
    int (*fetch)(void *arg, int32_t unit, const GPT_REAL **w);
    int (*release)(void *arg, int32_t unit);
    /* a zeroed buffer for the unit's gradient of this micro-batch (the embedding unit's is asked for once
     * and gathers both of wte's uses), and the call that says it is complete */
    int (*grad)(void *arg, int32_t unit, GPT_REAL **g);
    int (*grad_done)(void *arg, int32_t unit);
    /* optional (float only): a fetched unit's parameters in their bf16 storage, or NULL. Given, the block
     * matrices and the tied head multiply in bf16 with fp32 sums, and fetch need not widen the blocks'
     * four weight matrices (it widens everything else). */
    const uint16_t *(*fetched16)(void *arg, int32_t unit);
};

/* What a block's backward needs from its forward, for B sequences of T tokens (N = B * T rows). */
struct GPT_SUF(gpt_block_acts) {
    GPT_REAL *ln1, *ln1_mean, *ln1_rstd;   /* [N, C], [N], [N] */
    GPT_REAL *qkv;                         /* [N, 3C] */
    GPT_REAL *att;                         /* [B, H, T, T] softmax probabilities (causal: s <= t) */
    GPT_REAL *atty;                        /* [N, C] attention output before its projection */
    GPT_REAL *res2;                        /* [N, C] residual after attention */
    GPT_REAL *ln2, *ln2_mean, *ln2_rstd;
    GPT_REAL *fch, *fchg;                  /* [N, 4C] before and after GELU (fchg unwritten in bf16) */
    uint16_t *ln1_16, *atty16, *ln2_16, *fchg16; /* bf16 products: their inputs rounded, kept for backward */
};

struct GPT_SUF(gpt_model) {
    struct gpt_config cfg;
    const struct gpt_layout *lay;
    int64_t max_batch;                     /* sequences per call, at most */
    int recompute;                         /* keep only block inputs; redo each block's forward in backward */
    GPT_REAL **resid;                      /* [layers + 1] residual stream at each block's input, and after */
    struct GPT_SUF(gpt_block_acts) *acts;  /* one per block, or one shared with recompute */
    GPT_REAL *lnf, *lnf_mean, *lnf_rstd, *logits;
    GPT_REAL *dres, *dln, *dh, *dqkv, *datt; /* backward scratch */
    double *row_loss;
    uint16_t *x16, *y16;                   /* bf16 products: the head's input rounded; gradients rounded */
};

int GPT_SUF(gpt_model_init)(struct GPT_SUF(gpt_model) *m, const struct gpt_config *cfg,
                            const struct gpt_layout *lay, int64_t max_batch, int recompute);
void GPT_SUF(gpt_model_free)(struct GPT_SUF(gpt_model) *m);

/* One micro-batch of B sequences of ctx tokens (in, targets: [B, ctx]): forward through every unit, the
 * mean cross-entropy over the B * ctx tokens into *loss, and with `train` the backward, whose gradients
 * (of the mean loss times grad_scale) are handed over unit by unit as each is complete. Without targets
 * (NULL) only the logits are computed (m->logits, [B, ctx, vocab]). Returns 0 or the io's code. */
int GPT_SUF(gpt_model_run)(struct GPT_SUF(gpt_model) *m, const struct GPT_SUF(gpt_io) *io, const int32_t *in,
                           const int32_t *targets, int64_t B, int train, double grad_scale, double *loss);
