/* Expert parallelism on the CPU: expert placement (contiguous and explicit
 * maps, every refusal), the local layer's spec, the buffer layout of one
 * forward and its sizing, NCCL unique ids as text and files, NCCL missing,
 * and the ep kernels compiling with NVRTC for every preset. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "common/common.h"
#include "compile/compile.h"
#include "dist/ep.h"
#include "test_support.h"

TestSuite(ep_plan, .timeout = 300);

/* Every expert has exactly one owner, local indices count 0.. per rank in
 * id order, and local_experts lists this rank's experts ascending. */
static void check_placement(const mj_ep_placement *p) {
  int seen[MOEJIT_EP_MAX_WORLD] = {0};
  for (int e = 0; e < p->experts; e++) {
    const int r = p->owner[e];
    cr_assert(r >= 0 && r < p->world, "expert %d owner %d", e, r);
    cr_assert_eq(p->local_index[e], seen[r], "expert %d: local index %d, expected %d", e,
                 p->local_index[e], seen[r]);
    seen[r]++;
  }
  int total = 0;
  for (int r = 0; r < p->world; r++) {
    cr_assert_eq(seen[r], p->per_rank[r]);
    cr_assert_gt(p->per_rank[r], 0, "rank %d owns nothing", r);
    total += seen[r];
  }
  cr_assert_eq(total, p->experts);
  cr_assert_eq(p->n_local, p->per_rank[p->rank]);
  for (int i = 0; i < p->n_local; i++) {
    cr_assert_eq(p->owner[p->local_experts[i]], p->rank);
    cr_assert_eq(p->local_index[p->local_experts[i]], i);
    if (i) cr_assert_gt(p->local_experts[i], p->local_experts[i - 1]);
  }
}

Test(ep_plan, contiguous_ranges_match_the_documented_formula) {
  static const int experts[] = {1, 7, 8, 60, 64, 128, 256, 1024};
  static const int worlds[] = {1, 2, 3, 4, 7, 8, 64};
  for (size_t i = 0; i < sizeof experts / sizeof *experts; i++)
    for (size_t j = 0; j < sizeof worlds / sizeof *worlds; j++) {
      const int E = experts[i], W = worlds[j];
      if (E < W) continue;
      for (int rank = 0; rank < W; rank++) {
        mj_ep_placement p;
        cr_assert_eq(mj_ep_place(E, W, rank, NULL, &p), MOEJIT_OK, "E=%d W=%d: %s", E, W,
                     moejit_last_error());
        check_placement(&p);
        const int first = (int)((int64_t)rank * E / W), last = (int)((int64_t)(rank + 1) * E / W);
        cr_assert_eq(p.n_local, last - first, "E=%d W=%d rank %d", E, W, rank);
        cr_assert_eq(p.local_experts[0], first);
      }
    }
}

Test(ep_plan, explicit_maps_are_taken_as_given) {
  ts_rng r = ts_rng_fresh("ep_explicit");
  for (int trial = 0; trial < 200; trial++) {
    const int W = 1 + (int)(ts_next(&r) % 8), E = W + (int)(ts_next(&r) % 300);
    int32_t owner[1024];
    for (int e = 0; e < E; e++) owner[e] = e < W ? e : (int32_t)(ts_next(&r) % (uint64_t)W);
    /* shuffle so the guaranteed experts are anywhere */
    for (int e = E - 1; e > 0; e--) {
      int o = (int)(ts_next(&r) % (uint64_t)(e + 1));
      int32_t t = owner[e];
      owner[e] = owner[o], owner[o] = t;
    }
    const int rank = (int)(ts_next(&r) % (uint64_t)W);
    mj_ep_placement p;
    cr_assert_eq(mj_ep_place(E, W, rank, owner, &p), MOEJIT_OK, "%s", moejit_last_error());
    check_placement(&p);
    for (int e = 0; e < E; e++) cr_assert_eq(p.owner[e], owner[e]);
  }
}

static void expect_refused(int E, int W, int rank, const int32_t *owner, const char *needle) {
  mj_ep_placement p;
  cr_assert_eq(mj_ep_place(E, W, rank, owner, &p), MOEJIT_ERR_INVALID_ARGUMENT,
               "E=%d W=%d rank=%d was accepted", E, W, rank);
  cr_assert(strstr(moejit_last_error(), needle), "message '%s' lacks '%s'", moejit_last_error(),
            needle);
}

Test(ep_plan, bad_placements_are_refused_with_what_to_fix) {
  expect_refused(8, 0, 0, NULL, "ep.world = 0");
  expect_refused(8, MOEJIT_EP_MAX_WORLD + 1, 0, NULL, "allowed 1..64");
  expect_refused(8, 2, 2, NULL, "ep.rank = 2");
  expect_refused(8, 2, -1, NULL, "ep.rank = -1");
  expect_refused(4, 8, 0, NULL, "at most 4 ranks");
  int32_t owner[8] = {0, 1, 0, 1, 0, 1, 0, 5};
  expect_refused(8, 2, 0, owner, "ep.expert_owner[7] = 5");
  int32_t lonely[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  expect_refused(8, 2, 0, lonely, "rank 1 owns no expert");
  owner[7] = -3;
  expect_refused(8, 2, 0, owner, "ep.expert_owner[7] = -3");
}

Test(ep_plan, the_local_spec_validates_even_with_fewer_experts_than_top_k) {
  const char *const *names = moejit_preset_names();
  for (int i = 0; names[i]; i++) {
    moejit_spec g;
    cr_assert_eq(moejit_spec_load_preset(names[i], &g), MOEJIT_OK);
    const int counts[] = {1, g.top_k - 1, g.top_k, g.experts / 2, g.experts};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
      if (counts[c] < 1) continue;
      moejit_spec l;
      mj_ep_local_spec(&g, counts[c], &l);
      cr_assert_eq(moejit_spec_validate(&l), MOEJIT_OK, "%s with %d local experts: %s", names[i],
                   counts[c], moejit_last_error());
      cr_assert_eq(l.experts, counts[c] > g.top_k ? counts[c] : g.top_k);
      cr_assert_eq(l.top_k, g.top_k);
      cr_assert_eq(l.hidden, g.hidden);
      cr_assert_eq(l.expert_width, g.expert_width);
      cr_assert_eq(l.act_dtype, g.act_dtype);
      cr_assert_eq(l.out_dtype, g.out_dtype);
      cr_assert_eq(memcmp(&l.gemm1, &g.gemm1, sizeof l.gemm1), 0, "same GEMM tiles");
    }
  }
}

/* Regions are 256-byte aligned, in order, disjoint and large enough. */
Test(ep_plan, layout_regions_are_aligned_disjoint_and_sized) {
  moejit_spec s;
  cr_assert_eq(moejit_spec_load_preset("deepseek-v3", &s), MOEJIT_OK);
  ts_rng r = ts_rng_fresh("ep_layout");
  for (int trial = 0; trial < 100; trial++) {
    const int W = 1 + (int)(ts_next(&r) % 64);
    const int64_t T = 1 + (int64_t)(ts_next(&r) % 5000);
    const int64_t S = (int64_t)(ts_next(&r) % (uint64_t)(W * T + 1));
    const int64_t R = (int64_t)(ts_next(&r) % (uint64_t)(W * T + 1));
    const size_t local = (size_t)(ts_next(&r) % 100000000);
    const size_t split = (size_t)(ts_next(&r) % 4000000); /* the router's parts */
    mj_ep_layout l;
    cr_assert_eq(mj_ep_layout_for(&s, W, T, S, R, local, split, &l), MOEJIT_OK);
    const size_t k = (size_t)s.top_k, d = (size_t)s.hidden;
    const struct {
      size_t at, bytes;
    } reg[] = {{l.ids, T * k * 4},
               {l.weights, T * k * 4},
               {l.mask, T * 8},
               {l.pos, W * T * 4},
               {l.counts, W * 4},
               {l.recv_counts, W * 4},
               {l.dropped_by_rank, W * 4},
               {l.logits, T * s.experts * 4},
               {l.router_split, split},
               {l.send_x, S * d * 2},
               {l.send_ids, S * k * 4},
               {l.send_w, S * k * 4},
               {l.recv_x, R * d * 2},
               {l.recv_ids, R * k * 4},
               {l.recv_w, R * k * 4},
               {l.partial, R * d * 2},
               {l.back, S * d * 2},
               {l.local_ws, local}};
    for (size_t i = 0; i < sizeof reg / sizeof *reg; i++) {
      cr_assert_eq(reg[i].at % 256, 0, "region %zu misaligned", i);
      const size_t end = reg[i].at + reg[i].bytes;
      const size_t next = i + 1 < sizeof reg / sizeof *reg ? reg[i + 1].at : l.total;
      cr_assert_leq(end, next, "region %zu overlaps the next", i);
    }
    cr_assert_leq(l.router_split + split, l.head, "the front part ends at head");
    cr_assert_eq(l.head, l.send_x);
    /* the front part depends on T and W only */
    mj_ep_layout z;
    cr_assert_eq(mj_ep_layout_for(&s, W, T, 0, 0, 0, split, &z), MOEJIT_OK);
    cr_assert_eq(z.head, l.head);
    cr_assert_eq(z.pos, l.pos);
  }
}

Test(ep_plan, max_rows_cover_every_rank_sending_all_its_tokens) {
  cr_assert_eq(mj_ep_max_rows(1, 7), 7);
  cr_assert_eq(mj_ep_max_rows(8, 4096), 8 * 4096);
}

Test(ep_plan, unique_ids_round_trip_as_text_and_files) {
  moejit_nccl_id id, back;
  ts_rng r = ts_rng_fresh("ep_id");
  for (size_t i = 0; i < sizeof id.bytes; i++) id.bytes[i] = (unsigned char)ts_next(&r);
  char text[300];
  cr_assert_eq(moejit_nccl_id_format(&id, text, sizeof text), MOEJIT_OK);
  cr_assert_eq(strlen(text), 256);
  cr_assert_eq(moejit_nccl_id_parse(text, &back), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(memcmp(&id, &back, sizeof id), 0);
  for (char *c = text; *c; c++) *c = (char)(*c >= 'a' ? *c - 32 : *c); /* upper case */
  char padded[310];
  snprintf(padded, sizeof padded, "  %s\n", text);
  cr_assert_eq(moejit_nccl_id_parse(padded, &back), MOEJIT_OK);
  cr_assert_eq(memcmp(&id, &back, sizeof id), 0);

  cr_assert_eq(moejit_nccl_id_format(&id, text, 256), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert_eq(moejit_nccl_id_parse("abc", &back), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "3 hex digits"), "%s", moejit_last_error());
  moejit_nccl_id_format(&id, text, sizeof text);
  text[17] = 'g';
  cr_assert_eq(moejit_nccl_id_parse(text, &back), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "character 18 ('g')"), "%s", moejit_last_error());

  char *dir = ts_mkdtemp("ep_id");
  char path[1024];
  snprintf(path, sizeof path, "%s/id", dir);
  cr_assert_eq(moejit_nccl_id_read_file(path, 0, &back), MOEJIT_ERR_NOT_FOUND);
  cr_assert(strstr(moejit_last_error(), "moejit_nccl_id_write_file"), "%s", moejit_last_error());
  cr_assert_eq(moejit_nccl_id_read_file(path, 60, &back), MOEJIT_ERR_NOT_FOUND, "waits, then fails");
  cr_assert_eq(moejit_nccl_id_write_file(path, &id), MOEJIT_OK, "%s", moejit_last_error());
  memset(&back, 0, sizeof back);
  cr_assert_eq(moejit_nccl_id_read_file(path, 1000, &back), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(memcmp(&id, &back, sizeof id), 0);
  FILE *f = fopen(path, "w");
  fputs("not an id\n", f);
  fclose(f);
  cr_assert_eq(moejit_nccl_id_read_file(path, 0, &back), MOEJIT_ERR_INVALID_ARGUMENT);
  snprintf(path, sizeof path, "%s/missing-dir/id", dir);
  cr_assert_eq(moejit_nccl_id_write_file(path, &id), MOEJIT_ERR_IO, "unwritable path");
  ts_rmtree(dir);
  free(dir);
}

/* An empty id file is "0 hex digits", every time: the file's text, read
 * into a buffer nothing was appended to, is "" (it was uninitialised heap,
 * here made dirty first so that the old read showed it). */
Test(ep_plan, an_empty_id_file_is_an_empty_id) {
  for (int i = 0; i < 8; i++) {
    char *dirt = malloc(256);
    memset(dirt, 'x', 256);
    free(dirt);
    char *dir = ts_mkdtemp("ep_empty_id");
    char *path = ts_write_file(dir, "id", "");
    moejit_nccl_id id;
    cr_assert_eq(moejit_nccl_id_read_file(path, 0, &id), MOEJIT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(moejit_last_error(), "0 hex digits"), "%s", moejit_last_error());
    free(path);
    ts_rmtree(dir);
    free(dir);
  }
}

Test(ep_plan, nccl_missing_is_a_clear_unsupported) {
  setenv("MOEJIT_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  int v = 123;
  cr_assert_eq(moejit_nccl_version(&v), MOEJIT_ERR_UNSUPPORTED);
  cr_assert_eq(v, 0);
  const char *msg = moejit_last_error();
  cr_assert(strstr(msg, "/nonexistent/libnccl.so.2"), "names what was tried: %s", msg);
  cr_assert(strstr(msg, "MOEJIT_NCCL_LIBRARY"), "says how to fix: %s", msg);
  moejit_nccl_id id;
  cr_assert_eq(moejit_nccl_unique_id(&id), MOEJIT_ERR_UNSUPPORTED, "same answer every call");
  cr_assert_eq(moejit_nccl_version(NULL), MOEJIT_ERR_INVALID_ARGUMENT);
}

/* The loader's words for an NCCL that cannot serve (tests/fake_nccl): its
 * version, decoded from either of NCCL's version codes, or the failed
 * call; a long library path never pushes the hint out of the message. */
Test(ep_plan, nccl_too_old_or_failing_says_which) {
  setenv("MOEJIT_NCCL_LIBRARY", MOEJIT_FAKE_NCCL_PATH, 1);
  setenv("FAKE_NCCL_VERSION", "2804", 1); /* 2.8.4, the code before 2.9 */
  int v = 1;
  cr_assert_eq(moejit_nccl_version(&v), MOEJIT_ERR_UNSUPPORTED);
  cr_assert(
      strstr(moejit_last_error(), "NCCL 2.8.4 (ncclGetVersion 2804) is too old: need 2.9.0") &&
          strstr(moejit_last_error(), "HINT"),
      "%s", moejit_last_error());
}

Test(ep_plan, nccl_version_codes_from_2_9_on) {
  setenv("MOEJIT_NCCL_LIBRARY", MOEJIT_FAKE_NCCL_PATH, 1);
  setenv("FAKE_NCCL_VERSION", "20900", 1);
  int v = 0;
  cr_assert_eq(moejit_nccl_version(&v), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(v, 20900);
}

Test(ep_plan, nccl_version_call_failing_is_named) {
  setenv("MOEJIT_NCCL_LIBRARY", MOEJIT_FAKE_NCCL_PATH, 1);
  setenv("FAKE_NCCL_VERSION_FAIL", "1", 1);
  int v = 1;
  cr_assert_eq(moejit_nccl_version(&v), MOEJIT_ERR_UNSUPPORTED);
  cr_assert(strstr(moejit_last_error(), "ncclGetVersion failed: NCCL error 3"), "%s",
            moejit_last_error());
}

/* A nonblocking communicator needs NCCL 2.14's ncclCommInitRankConfig and
 * ncclCommFinalize; the config moejit passes is NCCL 2.14's layout, which
 * the stand-in checks as NCCL does (size, magic, version). */
Test(ep_plan, nonblocking_communicators_from_2_14_with_the_config_nccl_reads) {
  setenv("MOEJIT_NCCL_LIBRARY", MOEJIT_FAKE_NCCL_PATH, 1);
  const mj_nccl *n = NULL;
  cr_assert_eq(mj_nccl_get(&n), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert(mj_nccl_has_nonblocking(n), "NCCL 2.28.3 with both entry points");
  mj_nccl_config c;
  memset(&c, 0x5a, sizeof c);
  mj_nccl_config_nonblocking(&c);
  cr_expect_eq(c.size, sizeof c);
  cr_expect_eq(c.magic, 0xcafebeefu);
  cr_expect_eq(c.version, 21400u);
  cr_expect_eq(c.blocking, 0);
  cr_expect(c.cga_cluster_size == MJ_NCCL_CONFIG_UNDEF_INT && c.min_ctas == c.cga_cluster_size &&
                c.max_ctas == c.cga_cluster_size && c.net_name == NULL,
            "NCCL's defaults for the rest");
  mj_nccl_unique_id id;
  cr_assert_eq(n->GetUniqueId(&id), MJ_NCCL_SUCCESS);
  mj_nccl_comm comm = NULL;
  cr_assert_eq(n->CommInitRankConfig(&comm, 2, id, 0, &c), MJ_NCCL_IN_PROGRESS);
  mj_nccl_result async = MJ_NCCL_IN_PROGRESS;
  while (async == MJ_NCCL_IN_PROGRESS) cr_assert_eq(n->CommGetAsyncError(comm, &async), 0);
  cr_assert_eq(async, MJ_NCCL_SUCCESS);
  cr_assert_eq(n->CommFinalize(comm), MJ_NCCL_IN_PROGRESS);
  async = MJ_NCCL_IN_PROGRESS;
  while (async == MJ_NCCL_IN_PROGRESS) cr_assert_eq(n->CommGetAsyncError(comm, &async), 0);
  cr_assert_eq(n->CommDestroy(comm), MJ_NCCL_SUCCESS);
  mj_nccl_comm other = NULL; /* a config NCCL would refuse */
  c.magic = 0;
  cr_expect_eq(n->CommInitRankConfig(&other, 2, id, 0, &c), MJ_NCCL_INVALID_ARGUMENT);
}

Test(ep_plan, no_nonblocking_communicators_before_2_14) {
  setenv("MOEJIT_NCCL_LIBRARY", MOEJIT_FAKE_NCCL_PATH, 1);
  setenv("FAKE_NCCL_VERSION", "21305", 1);
  const mj_nccl *n = NULL;
  cr_assert_eq(mj_nccl_get(&n), MOEJIT_OK, "%s", moejit_last_error());
  cr_expect_not(mj_nccl_has_nonblocking(n), "2.13.5");
}

Test(ep_plan, nccl_hint_survives_a_long_library_path) {
  char path[1000] = "/nonexistent/";
  memset(path + 13, 'p', sizeof path - 14);
  path[sizeof path - 1] = '\0';
  setenv("MOEJIT_NCCL_LIBRARY", path, 1);
  int v = 1;
  cr_assert_eq(moejit_nccl_version(&v), MOEJIT_ERR_UNSUPPORTED);
  cr_assert(strstr(moejit_last_error(), "HINT: expert parallelism needs NCCL 2.9"), "%s",
            moejit_last_error());
}

/* The wait and the abort need a model: NULL is refused, with no driver or
 * GPU needed to say so. */
Test(ep_plan, wait_and_abort_refuse_a_null_model) {
  cr_expect_eq(moejit_model_ep_wait(NULL, NULL, 0), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "moejit_model_ep_wait: model is NULL"), "%s",
            moejit_last_error());
  cr_expect_eq(moejit_model_ep_abort(NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "moejit_model_ep_abort: model is NULL"), "%s",
            moejit_last_error());
  cr_expect_str_eq(moejit_status_str(MOEJIT_ERR_TIMEOUT), "timed out");
}

/* ---- giving up on a communicator (ep_wait.c), with a stand-in abort --- */

static atomic_int aborts_called, abort_sleep_ms;

static mj_nccl_result slow_abort(mj_nccl_comm comm) {
  (void)comm;
  atomic_fetch_add(&aborts_called, 1);
  mj_sleep_us(atomic_load(&abort_sleep_ms) * 1000L);
  return MJ_NCCL_SUCCESS;
}

typedef struct abort_call {
  mj_ep *ep;
  int hung, owned;
  double took;
} abort_call;

static void *call_abort(void *arg) {
  abort_call *c = arg;
  const double t0 = mj_now_ms();
  c->owned = mj_ep_abort(c->ep, 300.0, &c->hung);
  c->took = mj_now_ms() - t0;
  return NULL;
}

/* Two threads give up at once while ncclCommAbort takes 1.5 s (NCCL's can
 * wait for a dead peer for ever): it runs once, on a thread of its own;
 * both callers get their thread back after the 300 ms bound and learn that
 * it has not returned; the model can go before it does. */
Test(ep_plan, an_abort_runs_once_and_its_waits_are_bounded) {
  static mj_nccl n;
  n.CommAbort = slow_abort;
  atomic_store(&abort_sleep_ms, 1500);
  mj_ep *ep = calloc(1, sizeof *ep);
  cr_assert_not_null(ep);
  ep->nccl = &n;
  ep->comm = (mj_nccl_comm)&n;
  ep->owns_comm = 1;
  cr_assert_eq(mj_ep_comm_enter(ep), 1, "a healthy communicator lets calls in");
  mj_ep_comm_leave(ep);
  abort_call c[2] = {{.ep = ep}, {.ep = ep}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&t[i], NULL, call_abort, &c[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 2; i++) {
    cr_expect_eq(c[i].owned, 1);
    cr_expect_eq(c[i].hung, 1, "caller %d: the abort had not returned", i);
    /* the later caller may return as soon as the first one's wait ran out */
    cr_expect(c[i].took < 1400, "caller %d waited %.0f ms", i, c[i].took);
  }
  cr_expect(c[0].took >= 250 || c[1].took >= 250, "the bound was waited for: %.0f, %.0f ms",
            c[0].took, c[1].took);
  cr_expect_eq(atomic_load(&aborts_called), 1, "ncclCommAbort ran once");
  cr_expect_eq(atomic_load(&ep->state), MJ_EP_ABORTED);
  cr_expect_eq(mj_ep_comm_enter(ep), 0, "no call enters NCCL on an aborted communicator");
  mj_ep_abort_job *job = atomic_load(&ep->abort_job);
  cr_expect_eq(mj_ep_abort_pending(job), 1);
  /* a later wait does not wait again for an abort that ran out */
  abort_call again = {.ep = ep};
  call_abort(&again);
  cr_expect(again.hung && again.took < 100, "again: hung %d after %.0f ms", again.hung, again.took);
  /* the model goes first; the abort's thread keeps the job */
  mj_ep_abort_release(job);
  free(ep);
  mj_sleep_us(1600000);
  cr_expect_eq(atomic_load(&aborts_called), 1);
}

/* A caller's communicator is never aborted by moejit. */
Test(ep_plan, a_callers_communicator_is_not_aborted) {
  static mj_nccl n;
  n.CommAbort = slow_abort;
  atomic_store(&abort_sleep_ms, 0);
  mj_ep ep;
  memset(&ep, 0, sizeof ep);
  ep.nccl = &n;
  ep.comm = (mj_nccl_comm)&n;
  int hung = 7;
  cr_expect_eq(mj_ep_abort(&ep, 300.0, &hung), 0);
  cr_expect_eq(hung, 0);
  cr_expect_eq(atomic_load(&aborts_called), 0);
  cr_expect_eq(mj_ep_comm_enter(&ep), 1);
  mj_ep_comm_leave(&ep);
}

Test(ep_plan, ep_kernels_compile_for_every_preset, .timeout = 600) {
  const char *const *names = moejit_preset_names();
  for (int i = 0; names[i]; i++) {
    moejit_spec s;
    cr_assert_eq(moejit_spec_load_preset(names[i], &s), MOEJIT_OK);
    const char *archs[] = {"sm_90a", "sm_80"};
    for (int a = 0; a < 2; a++) {
      mj_kernel_source ks;
      cr_assert_eq(mj_codegen(&s, "ep", archs[a], NULL, &ks), MOEJIT_OK, "%s", moejit_last_error());
      const char *want[] = {"moejit_ep_mask", "moejit_ep_scan", "moejit_ep_pack",
                            "moejit_ep_combine"};
      cr_assert_eq(ks.n_entries, 4);
      mj_compile_opts o = {.arch = archs[a], .lineinfo = 1};
      char *ptx = NULL;
      void *cubin = NULL;
      size_t ptx_len = 0, cubin_len = 0;
      cr_assert_eq(mj_nvrtc_compile(&ks, &o, &ptx, &ptx_len, &cubin, &cubin_len), MOEJIT_OK,
                   "%s %s: %s", names[i], archs[a], moejit_last_error());
      for (int e = 0; e < 4; e++) cr_assert(strstr(ptx, want[e]), "PTX lacks %s", want[e]);
      free(ptx);
      free(cubin);
      mj_kernel_source_free(&ks);
    }
  }
}
