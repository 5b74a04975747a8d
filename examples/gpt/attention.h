/* attention.h - causal multi-head self-attention in float through matrix products: per (sequence, head)
 * the scores Q K^T, the softmax, P V and their backward as cblas_sgemm calls over blocks of 64 rows that
 * skip the masked upper triangle but for the diagonal blocks. Same contract as layers_tmpl.h's plain
 * attention_forward and attention_backward (which the double passes keep as the reference). */
#ifndef GPT_ATTENTION_H
#define GPT_ATTENTION_H

#include <stdint.h>

/* qkv [B, T, 3C] (q, k, v of token t, head h at columns h*hs.. of each third); att [B, H, T, T] receives
 * the probabilities (zero above the diagonal); y [B, T, C]. */
void gpt_attention_forward(float *y, float *att, const float *qkv, int64_t B, int64_t T, int64_t C, int64_t H);

/* dqkv [B, T, 3C] overwritten with the gradient at qkv, from dy [B, T, C]; datt is scratch of att's size. */
void gpt_attention_backward(float *dqkv, float *datt, const float *dy, const float *att, const float *qkv, int64_t B,
                            int64_t T, int64_t C, int64_t H);

#endif /* GPT_ATTENTION_H */
