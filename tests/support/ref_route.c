/* Float64 reference of routing (see ref_route.h): selection by k rounds of
 * argmax with ties to the lower index, NaN as -inf. */
#include "ref_route.h"

#include <math.h>
#include <stdlib.h>

static double no_nan(double v) {
  return isnan(v) ? -INFINITY : v;
}

static double sigmoid(double x) {
  return 1.0 / (1.0 + exp(-no_nan(x)));
}

/* The best index among n values not yet taken: larger value, then lower
 * index. -1 if none is left. */
static int argmax_free(const double *v, const unsigned char *taken, int n) {
  int best = -1;
  for (int i = 0; i < n; i++)
    if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
  return best;
}

/* Smallest positive gap between consecutive values of a ranking. */
static double min_gap(const double *ranked, int n) {
  double m = INFINITY;
  for (int i = 0; i + 1 < n; i++) {
    const double gap = ranked[i] - ranked[i + 1];
    if (gap > 0 && gap < m) m = gap;
  }
  return m;
}

void ref_route_weights(const ref_route_cfg *c, const float *logits, const int *ids,
                       double *weights) {
  const int E = c->experts, k = c->top_k;
  double denom = 0.0;
  if (c->rule == 0) {
    double max = -INFINITY;
    for (int e = 0; e < E; e++) max = fmax(max, no_nan(logits[e]));
    for (int j = 0; j < k; j++) {
      const double x = no_nan(logits[ids[j]]);
      weights[j] = x == max ? 1.0 : exp(x - max);
    }
    if (c->renormalize) {
      for (int j = 0; j < k; j++) denom += weights[j];
    } else {
      for (int e = 0; e < E; e++) {
        const double x = no_nan(logits[e]);
        denom += x == max ? 1.0 : exp(x - max);
      }
    }
  } else {
    for (int j = 0; j < k; j++) weights[j] = sigmoid(logits[ids[j]]);
    if (c->renormalize) {
      for (int j = 0; j < k; j++) denom += weights[j];
      denom += 1e-20;
    } else {
      denom = 1.0;
    }
  }
  for (int j = 0; j < k; j++) weights[j] = weights[j] / denom * c->scaling_factor;
}

/* Marks the experts of groups outside the topk_group best as taken; returns
 * the margin of that cut. */
static double drop_groups(const ref_route_cfg *c, const double *biased, unsigned char *taken) {
  const int G = c->experts / c->n_group;
  double merit[32 + 1024], ranked[32 + 1024];
  unsigned char group_taken[1024] = {0};
  for (int g = 0; g < c->n_group; g++) {
    double top1 = -INFINITY, top2 = -INFINITY;
    for (int i = g * G; i < (g + 1) * G; i++) {
      if (biased[i] > top1)
        top2 = top1, top1 = biased[i];
      else if (biased[i] > top2)
        top2 = biased[i];
    }
    merit[g] = no_nan(G >= 2 ? top1 + top2 : top1);
  }
  for (int r = 0; r < c->n_group; r++) {
    const int g = argmax_free(merit, group_taken, c->n_group);
    ranked[r] = merit[g];
    group_taken[g] = r < c->topk_group ? 1 : 2; /* 1 kept, 2 dropped */
  }
  for (int e = 0; e < c->experts; e++)
    if (group_taken[e / G] == 2) taken[e] = 1;
  /* Only the cut matters: which groups are kept, not their order. */
  return c->topk_group < c->n_group ? min_gap(ranked + c->topk_group - 1, 2) : INFINITY;
}

double ref_route_token(const ref_route_cfg *c, const float *logits, const float *bias, int *ids,
                       double *weights) {
  const int E = c->experts, k = c->top_k;
  double *score = malloc(sizeof(double) * (size_t)E);
  unsigned char *taken = calloc((size_t)E, 1);
  double ranked[33];
  double margin = INFINITY;
  for (int e = 0; e < E; e++)
    score[e] = c->rule == 0 ? no_nan(logits[e])
                            : no_nan(sigmoid(logits[e]) + (bias ? (double)bias[e] : 0.0));
  if (c->rule == 1 && c->n_group > 1) margin = drop_groups(c, score, taken);
  int n_ranked = 0;
  for (int j = 0; j <= k; j++) { /* one more than k: the first one left out */
    const int e = argmax_free(score, taken, E);
    if (e < 0) break;
    if (j < k) ids[j] = e;
    ranked[n_ranked++] = score[e];
    taken[e] = 1;
  }
  if (c->rule == 1) margin = fmin(margin, min_gap(ranked, n_ranked));
  ref_route_weights(c, logits, ids, weights);
  free(score);
  free(taken);
  return margin;
}

void ref_route(const ref_route_cfg *c, int64_t tokens, const float *logits, const float *bias,
               int *ids, double *weights, double *margins) {
  const int64_t E = c->experts, k = c->top_k;
  for (int64_t t = 0; t < tokens; t++) {
    const double m = ref_route_token(c, logits + t * E, bias, ids + t * k, weights + t * k);
    if (margins) margins[t] = m;
  }
}
