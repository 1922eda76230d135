/* Float64 CPU reference of the router (templates/route.cu): the same rules
 * and the same tie and NaN policy (docs/kernels.md, "route"), computed in
 * double from the logits as stored (fp32, or bf16 widened to float). */
#ifndef MOEJIT_TEST_REF_ROUTE_H
#define MOEJIT_TEST_REF_ROUTE_H

#include <stdint.h>

typedef struct ref_route_cfg {
  int experts, top_k;
  int rule;                /* 0 softmax_topk, 1 sigmoid_grouped_topk */
  int renormalize;         /* 0 or 1 */
  int n_group, topk_group; /* sigmoid rule; 1, 1 for softmax */
  double scaling_factor;
} ref_route_cfg;

/* Routes one token: logits[E]; bias[E] or NULL (zero; sigmoid rule only).
 * Writes ids[k] in selection order and their weights[k]. Returns the
 * token's decision margin: the smallest nonzero gap between two scores
 * whose order decides the result (the k+1 best biased scores among the kept
 * groups, and the group merits around the cut), +INFINITY for softmax, which
 * compares the inputs themselves. A GPU computing scores in fp32 can only
 * disagree with this reference where the margin is within its rounding. */
double ref_route_token(const ref_route_cfg *cfg, const float *logits, const float *bias, int *ids,
                       double *weights);

/* The weights the rule gives to the chosen `ids` of one token (for checking
 * a GPU result whose ids legitimately differ at a near-tie). */
void ref_route_weights(const ref_route_cfg *cfg, const float *logits, const int *ids,
                       double *weights);

/* All T tokens: logits [T, E]; ids, weights [T, k]; margins [T] or NULL. */
void ref_route(const ref_route_cfg *cfg, int64_t tokens, const float *logits, const float *bias,
               int *ids, double *weights, double *margins);

#endif
