/* Reference align (a stable counting sort) and the property checker; see
 * ref_align.h. */
#include "ref_align.h"

#include <stdio.h>
#include <stdlib.h>

static int kept_expert(const ref_align_shape *s, int32_t id) {
  return id >= s->first && id < s->last;
}

int64_t ref_align_tile_capacity(const ref_align_shape *s) {
  const int64_t n = s->tokens * s->top_k, bound = n / s->tile_m + s->experts;
  return n < bound ? n : bound;
}

int ref_align_out_alloc(const ref_align_shape *s, ref_align_out *o) {
  const size_t n = (size_t)(s->tokens * s->top_k);
  o->tile_capacity = ref_align_tile_capacity(s);
  o->num_tiles = 0;
  o->counts = malloc(sizeof(int32_t) * (size_t)s->experts);
  o->offsets = malloc(sizeof(int32_t) * (size_t)(s->experts + 1));
  o->sorted_slot = malloc(sizeof(int32_t) * n);
  o->row_of = malloc(sizeof(int32_t) * n);
  o->tile_expert = malloc(sizeof(int32_t) * (size_t)o->tile_capacity);
  o->tile_row_start = malloc(sizeof(int32_t) * (size_t)o->tile_capacity);
  return o->counts && o->offsets && o->sorted_slot && o->row_of && o->tile_expert &&
         o->tile_row_start;
}

void ref_align_out_free(ref_align_out *o) {
  free(o->counts);
  free(o->offsets);
  free(o->sorted_slot);
  free(o->row_of);
  free(o->tile_expert);
  free(o->tile_row_start);
}

static void write_tiles(const ref_align_shape *s, ref_align_out *o) {
  int64_t i = 0;
  for (int e = 0; e < s->experts; e++)
    for (int32_t r = o->offsets[e]; r < o->offsets[e + 1]; r += s->tile_m, i++) {
      o->tile_expert[i] = e;
      o->tile_row_start[i] = r;
    }
  o->num_tiles = (int32_t)i;
  for (; i < o->tile_capacity; i++) o->tile_expert[i] = o->tile_row_start[i] = -1;
}

void ref_align(const ref_align_shape *s, const int32_t *ids, ref_align_out *o) {
  const int64_t n = s->tokens * s->top_k;
  for (int e = 0; e < s->experts; e++) o->counts[e] = 0;
  for (int64_t i = 0; i < n; i++)
    if (kept_expert(s, ids[i])) o->counts[ids[i]]++;
  o->offsets[0] = 0;
  for (int e = 0; e < s->experts; e++) o->offsets[e + 1] = o->offsets[e] + o->counts[e];
  int32_t *next = malloc(sizeof(int32_t) * (size_t)s->experts);
  for (int e = 0; e < s->experts; e++) next[e] = o->offsets[e];
  for (int64_t i = 0; i < n; i++) o->sorted_slot[i] = -1;
  for (int64_t i = 0; i < n; i++) { /* entry order: stable */
    if (kept_expert(s, ids[i])) {
      const int32_t row = next[ids[i]]++;
      o->row_of[i] = row;
      o->sorted_slot[row] = (int32_t)i;
    } else {
      o->row_of[i] = -1;
    }
  }
  free(next);
  write_tiles(s, o);
}

/* ---- the checker -------------------------------------------------------- */

static char msg[256];

#define FAIL(...) return (snprintf(msg, sizeof msg, __VA_ARGS__), msg)

static const char *check_offsets(const ref_align_shape *s, const ref_align_out *o) {
  if (o->offsets[0] != 0) FAIL("offsets[0] = %d, not 0", o->offsets[0]);
  for (int e = 0; e < s->experts; e++) {
    if (o->counts[e] < 0 || o->offsets[e + 1] != o->offsets[e] + o->counts[e])
      FAIL("offsets[%d] = %d is not offsets[%d] + counts[%d] = %d + %d", e + 1, o->offsets[e + 1],
           e, e, o->offsets[e], o->counts[e]);
    if (!(e >= s->first && e < s->last) && o->counts[e] != 0)
      FAIL("expert %d is outside [%d, %d) but counts %d", e, s->first, s->last, o->counts[e]);
  }
  return NULL;
}

/* Each row below N holds a kept entry of the row's expert, in increasing
 * entry order within the expert, and row_of points back. */
static const char *check_rows(const ref_align_shape *s, const int32_t *ids,
                              const ref_align_out *o) {
  const int64_t n = s->tokens * s->top_k, kept_rows = o->offsets[s->experts];
  int e = 0;
  for (int64_t r = 0; r < n; r++) {
    const int32_t slot = o->sorted_slot[r];
    if (r >= kept_rows) {
      if (slot != -1)
        FAIL("sorted_slot[%lld] = %d past N = %lld, not -1", (long long)r, slot,
             (long long)kept_rows);
      continue;
    }
    while (r >= o->offsets[e + 1]) e++;
    if (slot < 0 || slot >= n) FAIL("sorted_slot[%lld] = %d is not an entry", (long long)r, slot);
    if (ids[slot] != e)
      FAIL("row %lld of expert %d holds entry %d of expert %d", (long long)r, e, slot, ids[slot]);
    if (o->row_of[slot] != r)
      FAIL("row_of[%d] = %d, but the entry sits in row %lld", slot, o->row_of[slot], (long long)r);
    if (r > o->offsets[e] && o->sorted_slot[r - 1] >= slot)
      FAIL("expert %d: entry %d comes after entry %d (not stable)", e, slot, o->sorted_slot[r - 1]);
  }
  return NULL;
}

/* Every entry: kept ones have a row (checked above to point back), dropped
 * ones -1; with counts summing to N this makes each kept entry appear once. */
static const char *check_entries(const ref_align_shape *s, const int32_t *ids,
                                 const ref_align_out *o) {
  const int64_t n = s->tokens * s->top_k;
  int64_t kept = 0;
  for (int64_t i = 0; i < n; i++) {
    const int32_t row = o->row_of[i];
    if (!kept_expert(s, ids[i])) {
      if (row != -1)
        FAIL("dropped entry %lld (expert %d) has row_of %d", (long long)i, ids[i], row);
      continue;
    }
    kept++;
    if (row < 0 || row >= o->offsets[s->experts] || o->sorted_slot[row] != i)
      FAIL("entry %lld: row_of = %d, but that row holds entry %d", (long long)i, row,
           row >= 0 && row < n ? o->sorted_slot[row] : -2);
  }
  if (kept != o->offsets[s->experts])
    FAIL("%lld kept entries but offsets[E] = %d", (long long)kept, o->offsets[s->experts]);
  return NULL;
}

static const char *check_tiles(const ref_align_shape *s, const ref_align_out *o) {
  int64_t i = 0;
  if (o->num_tiles < 0 || o->num_tiles > o->tile_capacity)
    FAIL("num_tiles = %d outside 0..capacity %lld", o->num_tiles, (long long)o->tile_capacity);
  for (int e = 0; e < s->experts; e++)
    for (int32_t r = o->offsets[e]; r < o->offsets[e + 1]; r += s->tile_m, i++)
      if (i >= o->num_tiles || o->tile_expert[i] != e || o->tile_row_start[i] != r)
        FAIL("tile %lld: (expert %d, row %d), expected (expert %d, row %d)", (long long)i,
             i < o->tile_capacity ? o->tile_expert[i] : -2,
             i < o->tile_capacity ? o->tile_row_start[i] : -2, e, r);
  if (i != o->num_tiles)
    FAIL("num_tiles = %d, but the experts need %lld", o->num_tiles, (long long)i);
  for (; i < o->tile_capacity; i++)
    if (o->tile_expert[i] != -1 || o->tile_row_start[i] != -1)
      FAIL("tile %lld past num_tiles is (%d, %d), not (-1, -1)", (long long)i, o->tile_expert[i],
           o->tile_row_start[i]);
  return NULL;
}

const char *ref_align_check(const ref_align_shape *s, const int32_t *ids, const ref_align_out *o) {
  const char *m;
  if ((m = check_offsets(s, o))) return m;
  if (o->offsets[s->experts] > s->tokens * s->top_k)
    FAIL("offsets[E] = %d exceeds T*k = %lld", o->offsets[s->experts],
         (long long)(s->tokens * s->top_k));
  if ((m = check_rows(s, ids, o))) return m;
  if ((m = check_entries(s, ids, o))) return m;
  return check_tiles(s, o);
}
