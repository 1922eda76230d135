/* moejit_combine: checks the arguments, then one launch of
 * moejit_combine_rows (templates/combine.cu), blocks looping over tiles of
 * tokens; the whole layer's combine also tidies L2 (mj_combine_tidied). */
#include "common/common.h"
#include "ops/ops.h"

static moejit_status check_combine_args(const moejit_model *m, const moejit_combine_args *a) {
  static const char op[] = "moejit_combine";
  moejit_status st;
  if ((st = mj_check_call(m, MJ_OPS_COMBINE, op, a))) return st;
  if ((st = mj_check_tokens(m, op, a->tokens))) return st;
  if ((st = mj_check_ptr(m, op, "y", a->y, 16))) return st;
  if ((st = mj_check_ptr(m, op, "row_of", a->row_of, 4))) return st;
  if ((st = mj_check_opt_ptr(m, op, "weights", a->weights, 4))) return st;
  return mj_check_ptr(m, op, "out", a->out, 16);
}

/* The whole 128-byte lines inside [p, p + bytes): *first and the count. */
static long long whole_lines(const void *p, size_t bytes, const char **first) {
  const uintptr_t start = ((uintptr_t)p + 127u) & ~(uintptr_t)127u;
  const uintptr_t end = ((uintptr_t)p + bytes) & ~(uintptr_t)127u;
  *first = (const char *)start;
  return p && end > start ? (long long)((end - start) / 128u) : 0;
}

moejit_status mj_combine_tidied(const moejit_model *model, const moejit_combine_args *args,
                                const mj_combine_tidy *tidy, moejit_stream stream) {
  moejit_status st = check_combine_args(model, args);
  if (st) return st;
  const moejit_spec *s = &model->spec;
  const mj_combine_tidy none = {0};
  if (!tidy) tidy = &none;
  const void *y = args->y;
  const int32_t *row_of = args->row_of;
  const float *weights = args->weights;
  int tokens = (int)args->tokens;
  void *out = args->out;
  const char *dead, *gathered;
  long long dead_lines = whole_lines(tidy->dead, tidy->dead_bytes, &dead);
  long long gathered_lines = whole_lines(tidy->gathered, tidy->gathered_bytes, &gathered);
  int drop_y = tidy->drop_y && (uintptr_t)y % 128u == 0;
  void *params[] = {&y,    &row_of,     &weights,  &tokens,         &out,
                    &dead, &dead_lines, &gathered, &gathered_lines, &drop_y};
  const int tile_tokens =
      mj_row_tile_tokens(s->hidden, moejit_dtype_size(s->act_dtype), s->combine.block_threads);
  const unsigned grid[3] = {mj_tile_grid(model, (args->tokens + tile_tokens - 1) / tile_tokens), 1,
                            1};
  const unsigned block[3] = {(unsigned)s->combine.block_threads, 1, 1};
  return mj_ctx_launch(model->ctx, model->combine, grid, block, 0, stream, params);
}

moejit_status moejit_combine(const moejit_model *model, const moejit_combine_args *args,
                             moejit_stream stream) {
  return mj_combine_tidied(model, args, NULL, stream);
}
