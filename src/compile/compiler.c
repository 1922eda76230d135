/* The public moejit_compiler: codegen -> cache key -> memory map -> disk
 * cache -> NVRTC -> store, for every kernel family x arch of a spec, on a
 * thread pool. Thread-safe: the map and the open caches sit under a mutex. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "common/common.h"
#include "compile/compile.h"
#include "config/config.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#define MJ_MEM_BUCKETS 256

/* One compiled kernel kept for the compiler's lifetime (the runtime loads
 * from these pointers, and a read-only cache must not mean recompiling). */
typedef struct mem_entry {
  char key[33];
  void *cubin;
  size_t len;
  struct mem_entry *next;
  /* the disk caches that hold it (it was read from or stored to them), so
   * that a hit in memory still lands in a request's other cache once; past
   * MJ_ENTRY_HOMES caches it is stored at every such hit (guarded by the
   * compiler's lock) */
#define MJ_ENTRY_HOMES 4
  const mj_cache *homes[MJ_ENTRY_HOMES];
  int n_homes;
} mem_entry;

/* A request already answered: (canonical spec, family, arch, entry set) ->
 * cache key, for the embedded templates only (they cannot change while the
 * process runs; files in a template directory can). A repeated request (a
 * model load resolves each module once to compile it and again for each
 * entry it looks up; a tuning sweep revisits its variants) then finds its
 * cubin in the memory map without generating and hashing the source. */
typedef struct src_memo {
  XXH128_hash_t id;
  char key[33];
  struct src_memo *next;
} src_memo;

/* An opened disk cache, one per distinct (directory, size limit). */
typedef struct cache_slot {
  char dir[MOEJIT_PATH_MAX];
  uint64_t max_bytes;
  mj_cache *cache;
} cache_slot;

struct moejit_compiler {
  pthread_mutex_t lock;
  char *cache_dir, *template_dir, *emit_dir; /* copies of the options; NULL: unset */
  int cache_disable, jobs, fast_math, lineinfo;
  uint64_t cache_max_bytes;
  int nvrtc_major, nvrtc_minor;
  cache_slot *slots;
  int n_slots;
  mem_entry *mem[MJ_MEM_BUCKETS];
  src_memo *memo[MJ_MEM_BUCKETS];
  atomic_long generated; /* sources generated (mj_compiler_generated) */
};

/* Where one request's cubins live on disk ("" dir: no disk cache). */
typedef struct cache_choice {
  char dir[MOEJIT_PATH_MAX];
  uint64_t max_bytes;
  mj_cache *cache;   /* NULL: disabled or unusable */
  char warning[384]; /* why an enabled cache is unusable */
} cache_choice;

void moejit_compiler_opts_init(moejit_compiler_opts *opts) {
  if (!opts) return;
  memset(opts, 0, sizeof *opts);
  opts->lineinfo = mj_env_switch("MOEJIT_LINEINFO", 0);
}

/* ------------------------------------------------------------------------ */
/* Lifetime                                                                 */

static int dup_opt(const char *s, char **out) {
  *out = NULL;
  if (!s || !*s) return 1;
  *out = strdup(s);
  return *out != NULL;
}

moejit_status moejit_compiler_create(moejit_compiler **out, const moejit_compiler_opts *opts) {
  if (!out) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_compiler_create: out is NULL");
  *out = NULL;
  moejit_compiler_opts defaults;
  moejit_compiler_opts_init(&defaults);
  if (!opts) opts = &defaults;
  moejit_compiler *c = calloc(1, sizeof *c);
  if (!c) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory creating a compiler");
  if (!dup_opt(opts->cache_dir, &c->cache_dir) || !dup_opt(opts->template_dir, &c->template_dir) ||
      !dup_opt(opts->emit_dir, &c->emit_dir) || pthread_mutex_init(&c->lock, NULL) != 0) {
    free(c->cache_dir), free(c->template_dir), free(c->emit_dir), free(c);
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory creating a compiler");
  }
  c->cache_disable = opts->cache_disable;
  c->cache_max_bytes = opts->cache_max_bytes;
  c->jobs = opts->jobs > 0 ? opts->jobs : 0;
  c->fast_math = opts->fast_math;
  c->lineinfo = opts->lineinfo;
  moejit_nvrtc_version(&c->nvrtc_major, &c->nvrtc_minor);
  *out = c;
  return MOEJIT_OK;
}

void moejit_compiler_destroy(moejit_compiler *c) {
  if (!c) return;
  for (int i = 0; i < MJ_MEM_BUCKETS; i++) {
    for (mem_entry *e = c->mem[i], *next; e; e = next) {
      next = e->next;
      free(e->cubin);
      free(e);
    }
    for (src_memo *m = c->memo[i], *next; m; m = next) {
      next = m->next;
      free(m);
    }
  }
  for (int i = 0; i < c->n_slots; i++) mj_cache_close(c->slots[i].cache);
  free(c->slots);
  free(c->cache_dir), free(c->template_dir), free(c->emit_dir);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

/* ------------------------------------------------------------------------ */
/* The in-memory map key -> cubin (callers hold c->lock)                    */

static unsigned mem_bucket(const char *key) {
  unsigned h = 0;
  for (int i = 0; i < 8 && key[i]; i++) h = h * 31u + (unsigned char)key[i];
  return h % MJ_MEM_BUCKETS;
}

static mem_entry *mem_find(moejit_compiler *c, const char *key) {
  for (mem_entry *e = c->mem[mem_bucket(key)]; e; e = e->next)
    if (strcmp(e->key, key) == 0) return e;
  return NULL;
}

/* Takes ownership of cubin. If another thread got there first, keeps the
 * first copy (pointers already handed out stay valid) and frees this one. */
static mem_entry *mem_insert(moejit_compiler *c, const char *key, void *cubin, size_t len) {
  pthread_mutex_lock(&c->lock);
  mem_entry *e = mem_find(c, key);
  if (!e && (e = calloc(1, sizeof *e))) {
    memcpy(e->key, key, 33);
    e->cubin = cubin;
    e->len = len;
    e->next = c->mem[mem_bucket(key)];
    c->mem[mem_bucket(key)] = e;
    cubin = NULL;
  }
  pthread_mutex_unlock(&c->lock);
  free(cubin);
  if (!e) mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory keeping a compiled kernel");
  return e;
}

/* 1 the first time `cache` is named for e (the caller then stores e
 * there, and mem_forget_home takes the claim back if that fails), 0 once e
 * is known to be in it or is being stored there. */
static int mem_first_in(moejit_compiler *c, const mem_entry *e, const mj_cache *cache) {
  mem_entry *m = (mem_entry *)e; /* the compiler's own entry */
  int first = 1;
  pthread_mutex_lock(&c->lock);
  for (int i = 0; i < m->n_homes && first; i++) first = m->homes[i] != cache;
  if (first && m->n_homes < MJ_ENTRY_HOMES) m->homes[m->n_homes++] = cache;
  pthread_mutex_unlock(&c->lock);
  return first;
}

/* e is not in `cache` after all (its store failed): a later request tries
 * again, rather than count a kernel that is not on disk as stored. */
static void mem_forget_home(moejit_compiler *c, const mem_entry *e, const mj_cache *cache) {
  mem_entry *m = (mem_entry *)e;
  pthread_mutex_lock(&c->lock);
  for (int i = 0; i < m->n_homes; i++)
    if (m->homes[i] == cache) {
      m->homes[i] = m->homes[--m->n_homes];
      break;
    }
  pthread_mutex_unlock(&c->lock);
}

static const mem_entry *mem_lookup(moejit_compiler *c, const char *key) {
  pthread_mutex_lock(&c->lock);
  const mem_entry *e = mem_find(c, key);
  pthread_mutex_unlock(&c->lock);
  return e;
}

int mj_compiler_memoizes(const moejit_compiler *c) {
  const char *env = getenv("MOEJIT_TEMPLATE_DIR");
  return !c->template_dir && !(env && *env);
}

/* The memo's id of a request; 0 where the memo does not apply. */
static int memo_id(const moejit_compiler *c, const moejit_spec *spec, const char *family,
                   const char *arch, const mj_entry_set *only, XXH128_hash_t *id) {
  if (!mj_compiler_memoizes(c)) return 0;
  moejit_spec canon;
  mj_spec_canonical(spec, &canon);
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  XXH3_128bits_update(&st, &canon, sizeof canon);
  XXH3_128bits_update(&st, family, strlen(family) + 1);
  XXH3_128bits_update(&st, arch, strlen(arch) + 1);
  for (int i = 0; only && i < only->n; i++)
    XXH3_128bits_update(&st, only->name[i], strlen(only->name[i]) + 1);
  *id = XXH3_128bits_digest(&st);
  return 1;
}

static unsigned memo_bucket(XXH128_hash_t id) {
  return (unsigned)(id.low64 % MJ_MEM_BUCKETS);
}

/* The memory-map entry of a memoized request (its key into key), or NULL. */
static const mem_entry *memo_lookup(moejit_compiler *c, XXH128_hash_t id, char key[33]) {
  const mem_entry *e = NULL;
  pthread_mutex_lock(&c->lock);
  for (const src_memo *m = c->memo[memo_bucket(id)]; m && !e; m = m->next)
    if (XXH128_isEqual(m->id, id) && (e = mem_find(c, m->key))) memcpy(key, m->key, 33);
  pthread_mutex_unlock(&c->lock);
  return e;
}

/* Remembers a request's key; out of memory only loses the shortcut. */
static void memo_insert(moejit_compiler *c, XXH128_hash_t id, const char *key) {
  src_memo *m = calloc(1, sizeof *m);
  if (!m) return;
  m->id = id;
  memcpy(m->key, key, 33);
  pthread_mutex_lock(&c->lock);
  int present = 0;
  for (const src_memo *o = c->memo[memo_bucket(id)]; o && !present; o = o->next)
    present = XXH128_isEqual(o->id, id);
  if (!present) {
    m->next = c->memo[memo_bucket(id)];
    c->memo[memo_bucket(id)] = m;
    m = NULL;
  }
  pthread_mutex_unlock(&c->lock);
  free(m);
}

long mj_compiler_generated(const moejit_compiler *c) {
  return atomic_load(&c->generated);
}

/* ------------------------------------------------------------------------ */
/* Cache directory and size: opts > env > spec > XDG > HOME                 */

static int env_set(const char *name, const char **value) {
  const char *v = getenv(name);
  *value = v;
  return v && *v;
}

static int cache_disabled(const moejit_compiler *c) {
  const char *v;
  return c->cache_disable || (env_set("MOEJIT_CACHE_DISABLE", &v) && strcmp(v, "0") != 0);
}

static moejit_status cache_dir_for(const moejit_compiler *c, const moejit_spec *spec, char *buf,
                                   size_t cap) {
  const char *v;
  if (c->cache_dir) return mj_cache_dir_printf(buf, cap, "%s", c->cache_dir);
  if (env_set("MOEJIT_CACHE_DIR", &v)) return mj_cache_dir_printf(buf, cap, "%s", v);
  if (spec && spec->cache_dir[0]) return mj_cache_dir_printf(buf, cap, "%s", spec->cache_dir);
  /* The rest as `moejit cache` and the maintenance calls resolve it
   * (XDG_CACHE_HOME only if absolute, as the XDG spec asks). */
  moejit_status s = mj_cache_default_dir(buf, cap);
  if (s != MOEJIT_ERR_CACHE) return s;
  return mj_fail(MOEJIT_ERR_CACHE,
                 "no cache directory: none of MOEJIT_CACHE_DIR, XDG_CACHE_HOME, HOME is set; "
                 "HINT: set MOEJIT_CACHE_DIR, pass a cache dir, or set MOEJIT_CACHE_DISABLE=1");
}

static moejit_status cache_max_for(const moejit_compiler *c, const moejit_spec *spec,
                                   uint64_t *max) {
  const char *v;
  *max = c->cache_max_bytes ? c->cache_max_bytes : spec ? spec->cache_max_bytes : 0;
  if (*max || !env_set("MOEJIT_CACHE_MAXSIZE", &v)) return MOEJIT_OK;
  moejit_status s = moejit_parse_size(v, max);
  return s ? mj_fail_prefix(s, "MOEJIT_CACHE_MAXSIZE='%s'", v) : MOEJIT_OK;
}

/* Opens each distinct cache once per compiler; a cache that cannot be
 * opened is retried on the next request (the user may fix it meanwhile). */
static mj_cache *cache_slot_get(moejit_compiler *c, const char *dir, uint64_t max, char *warning,
                                size_t cap) {
  mj_cache *found = NULL;
  pthread_mutex_lock(&c->lock);
  for (int i = 0; i < c->n_slots && !found; i++)
    if (c->slots[i].max_bytes == max && strcmp(c->slots[i].dir, dir) == 0)
      found = c->slots[i].cache;
  if (!found) {
    cache_slot *grown = realloc(c->slots, (size_t)(c->n_slots + 1) * sizeof *grown);
    if (grown) c->slots = grown;
    if (!grown)
      snprintf(warning, cap, "out of memory opening the cache; kernels kept in memory only");
    else if (mj_cache_open(dir, max, &found) != MOEJIT_OK)
      snprintf(warning, cap, "cache unusable, kernels kept in memory only: %s",
               moejit_last_error());
    if (found) {
      cache_slot *s = &c->slots[c->n_slots++];
      mj_strlcpy(s->dir, dir, sizeof s->dir);
      s->max_bytes = max;
      s->cache = found;
    }
  }
  pthread_mutex_unlock(&c->lock);
  return found;
}

static moejit_status cache_resolve(moejit_compiler *c, const moejit_spec *spec, cache_choice *out) {
  memset(out, 0, sizeof *out);
  if (cache_disabled(c)) return MOEJIT_OK;
  moejit_status s = cache_max_for(c, spec, &out->max_bytes);
  if (s) return s;
  /* Like a cache that cannot be opened, a directory that cannot be named
   * is a warning: the kernels stay in memory. */
  if ((s = cache_dir_for(c, spec, out->dir, sizeof out->dir))) {
    snprintf(out->warning, sizeof out->warning, "cache unusable, kernels kept in memory only: %s",
             moejit_last_error());
    out->dir[0] = '\0';
    return MOEJIT_OK;
  }
  out->cache = cache_slot_get(c, out->dir, out->max_bytes, out->warning, sizeof out->warning);
  return MOEJIT_OK;
}

moejit_status moejit_compiler_cache_dir(moejit_compiler *c, const moejit_spec *spec, char *buf,
                                        size_t cap) {
  if (!c || !buf || cap == 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_compiler_cache_dir: missing argument");
  buf[0] = '\0';
  if (cache_disabled(c)) return MOEJIT_OK;
  return cache_dir_for(c, spec, buf, cap);
}

/* ------------------------------------------------------------------------ */
/* One kernel: codegen -> key -> memory -> disk -> NVRTC -> store [-> emit] */

typedef struct kernel_job {
  const char *family, *arch;
  const mj_entry_set *only; /* NULL: every entry of the template */
  moejit_kernel_report report;
  const mem_entry *entry;
  char *full_message; /* the whole error text (NVRTC log), for last_error */
} kernel_job;

static void add_warning(moejit_kernel_report *r, const char *text) {
  size_t used = strlen(r->message);
  snprintf(r->message + used, sizeof r->message - used, "%s%s", used ? "; " : "", text);
}

static moejit_status emit_one(const char *dir, const mj_kernel_source *ks, const char *ext,
                              const void *data, size_t len) {
  char path[MOEJIT_PATH_MAX + 128];
  moejit_status s = mj_snprintf(path, sizeof path, "%s/%s.%s.%s", dir, ks->family, ks->arch, ext);
  if (!s) s = mj_write_file_atomic(path, data, len);
  return s ? mj_fail_prefix(s, "cannot write emitted %s file", ext) : MOEJIT_OK;
}

/* Writes <family>.<arch>.cu / .ptx / .cubin into the emit directory. */
static moejit_status emit_files(const char *dir, const mj_kernel_source *ks, const char *ptx,
                                size_t ptx_len, const mem_entry *e) {
  moejit_status s = mj_mkdir_p(dir, 0755);
  if (!s) s = emit_one(dir, ks, "cu", ks->source, ks->source_len);
  if (!s) s = emit_one(dir, ks, "ptx", ptx, ptx_len);
  if (!s) s = emit_one(dir, ks, "cubin", e->cubin, e->len);
  return s;
}

/* A kernel NVRTC rejected still gets its .cu written (the log's prelude
 * lines refer to it); the NVRTC error stays this thread's last error. */
static void emit_failed_source(const char *dir, const mj_kernel_source *ks) {
  char *msg = strdup(moejit_last_error());
  if (mj_mkdir_p(dir, 0755) == MOEJIT_OK) emit_one(dir, ks, "cu", ks->source, ks->source_len);
  if (msg) mj_fail(MOEJIT_ERR_COMPILE, "%s", msg);
  free(msg);
}

static moejit_status store_in_cache(const cache_choice *cc, const moejit_spec *spec,
                                    const char *family, const char *arch, const mem_entry *e,
                                    moejit_kernel_report *r) {
  mj_cache_meta meta;
  memset(&meta, 0, sizeof meta);
  mj_strlcpy(meta.kernel, family, sizeof meta.kernel);
  mj_strlcpy(meta.arch, arch, sizeof meta.arch);
  mj_spec_summary(spec, meta.summary, sizeof meta.summary);
  moejit_status st = mj_cache_store(cc->cache, e->key, &meta, e->cubin, e->len);
  if (st != MOEJIT_OK) {
    char w[512];
    snprintf(w, sizeof w, "not stored in the cache (kept in memory): %s", moejit_last_error());
    add_warning(r, w);
  }
  return st;
}

/* Stores e in the request's cache unless it is known to be there already
 * (read from it, or stored by an earlier request). */
static void store_once(moejit_compiler *c, const cache_choice *cc, const moejit_spec *spec,
                       const char *family, const char *arch, const mem_entry *e,
                       moejit_kernel_report *r) {
  if (cc->cache && mem_first_in(c, e, cc->cache) &&
      store_in_cache(cc, spec, family, arch, e, r) != MOEJIT_OK)
    mem_forget_home(c, e, cc->cache);
}

/* Runs NVRTC and keeps the result; with emit, also writes the files. */
static moejit_status compile_fresh(moejit_compiler *c, const moejit_spec *spec,
                                   const mj_kernel_source *ks, const char *key, int emit,
                                   const cache_choice *cc, kernel_job *job) {
  mj_compile_opts o = {.arch = ks->arch, .fast_math = c->fast_math, .lineinfo = c->lineinfo};
  char *ptx = NULL;
  size_t ptx_len = 0, len = 0;
  void *cubin = NULL;
  moejit_status s = mj_nvrtc_compile(ks, &o, emit ? &ptx : NULL, &ptx_len, &cubin, &len);
  if (s == MOEJIT_ERR_COMPILE && emit) emit_failed_source(c->emit_dir, ks);
  if (!s && !(job->entry = mem_insert(c, key, cubin, len))) s = MOEJIT_ERR_OUT_OF_MEMORY;
  if (!s) store_once(c, cc, spec, ks->family, ks->arch, job->entry, &job->report);
  if (!s && emit) s = emit_files(c->emit_dir, ks, ptx, ptx_len, job->entry);
  free(ptx);
  return s;
}

/* Memory map, then disk; 1 if found (job->entry set). */
static int lookup_cached(moejit_compiler *c, const char *key, const cache_choice *cc,
                         kernel_job *job) {
  if ((job->entry = mem_lookup(c, key))) return 1;
  void *data = NULL;
  size_t len = 0;
  if (!cc->cache || mj_cache_load(cc->cache, key, &data, &len) != MOEJIT_OK) return 0;
  job->entry = mem_insert(c, key, data, len);
  if (job->entry) mem_first_in(c, job->entry, cc->cache); /* read from it: it is there */
  return job->entry != NULL;
}

static moejit_status kernel_key(const moejit_compiler *c, const mj_kernel_source *ks,
                                char key[33]) {
  char opts[256], keyed[400];
  mj_compile_opts o = {.arch = ks->arch, .fast_math = c->fast_math, .lineinfo = c->lineinfo};
  mj_compile_opts_string(&o, opts, sizeof opts);
  /* the headers NVRTC reads from the toolkit are part of the cubin too, and
   * so is NVRTC's patch release, which its version does not tell */
  snprintf(keyed, sizeof keyed, "%s headers=%s nvrtc=%s", opts, mj_cuda_headers_digest(),
           mj_nvrtc_build_id());
  mj_cache_key(ks->source, ks->source_len, keyed, c->nvrtc_major, c->nvrtc_minor, ks->arch, key);
  return MOEJIT_OK;
}

/* force_emit: moejit_compile with an emit dir runs NVRTC even on a hit (the
 * PTX is not cached); the runtime path emits only what it compiles. */
static moejit_status build_kernel(moejit_compiler *c, const moejit_spec *spec,
                                  const cache_choice *cc, int force_emit, kernel_job *job) {
  moejit_kernel_report *r = &job->report;
  mj_strlcpy(r->kernel, job->family, sizeof r->kernel);
  mj_strlcpy(r->arch, job->arch, sizeof r->arch);
  if (cc->warning[0]) add_warning(r, cc->warning);
  const int emit = c->emit_dir != NULL;
  XXH128_hash_t id;
  const int memo =
      !(force_emit && emit) && memo_id(c, spec, job->family, job->arch, job->only, &id);
  if (memo && (job->entry = memo_lookup(c, id, r->key))) {
    r->cache_hit = 1;
    r->cubin_bytes = job->entry->len;
    store_once(c, cc, spec, job->family, job->arch, job->entry, r); /* built for another cache */
    return MOEJIT_OK;
  }
  mj_kernel_source ks;
  moejit_status s =
      mj_codegen_entries(spec, job->family, job->arch, c->template_dir, job->only, &ks);
  if (s) return s;
  atomic_fetch_add(&c->generated, 1);
  kernel_key(c, &ks, r->key);
  if (!(force_emit && emit) && lookup_cached(c, r->key, cc, job)) {
    r->cache_hit = 1;
    store_once(c, cc, spec, job->family, job->arch, job->entry, r); /* in memory, maybe not there */
  } else {
    s = compile_fresh(c, spec, &ks, r->key, emit, cc, job);
  }
  if (!s) r->cubin_bytes = job->entry->len;
  if (!s && memo) memo_insert(c, id, r->key);
  mj_kernel_source_free(&ks);
  return s;
}

static void run_job(moejit_compiler *c, const moejit_spec *spec, const cache_choice *cc,
                    int force_emit, kernel_job *job) {
  double t0 = mj_now_ms();
  moejit_status s = build_kernel(c, spec, cc, force_emit, job);
  job->report.ms = mj_now_ms() - t0;
  job->report.status = s;
  if (s) {
    const char *msg = moejit_last_error();
    job->full_message = strdup(msg);
    mj_strlcpy(job->report.message, msg, sizeof job->report.message);
  }
}

/* ------------------------------------------------------------------------ */
/* Public calls                                                             */

static moejit_status check_explicit_arch(const char *arch) {
  int has_a = 0;
  if (strcmp(arch, "auto") == 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "arch 'auto' needs a GPU and the compiler does not use one; HINT: pass an "
                   "explicit arch (e.g. sm_90a, sm_80) or compile through a moejit_ctx");
  if (strlen(arch) >= MOEJIT_ARCH_MAX || mj_arch_parse(arch, &has_a) <= 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "'%s' is not an arch name; HINT: use e.g. sm_80, sm_90a", arch);
  return MOEJIT_OK;
}

/* An explicit arch of a public call: a name (check_explicit_arch), and
 * one the spec's config rules allow (moejit_spec_validate_arch: sm_80a,
 * sm_75, clusters below sm_90), before anything is generated. */
static moejit_status check_request_arch(const moejit_spec *spec, const char *arch) {
  moejit_status s = check_explicit_arch(arch);
  if (!s && moejit_spec_validate_arch(spec, arch) != MOEJIT_OK)
    s = mj_fail_prefix(MOEJIT_ERR_INVALID_ARGUMENT, "arch '%s'", arch);
  return s;
}

/* The archs of a request: the explicit one, else every arch of the spec. */
static moejit_status request_archs(const moejit_spec *spec, const char *arch, const char **archs,
                                   int *n) {
  *n = 0;
  if (arch) {
    moejit_status s = check_request_arch(spec, arch);
    if (s) return s;
    archs[(*n)++] = arch;
  }
  for (int i = 0; !arch && i < spec->n_archs && i < MOEJIT_MAX_ARCHS; i++)
    archs[(*n)++] = spec->archs[i];
  if (*n == 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "the spec names no arch; HINT: pass an arch (e.g. sm_90a) or set archs");
  for (int i = 0; i < *n; i++) {
    moejit_status s = check_explicit_arch(archs[i]);
    if (s) return s;
  }
  return MOEJIT_OK;
}

typedef struct batch {
  moejit_compiler *c;
  const moejit_spec *spec;
  cache_choice cc;
  kernel_job *jobs;
} batch;

static void batch_job(size_t i, void *arg) {
  batch *b = arg;
  run_job(b->c, b->spec, &b->cc, 1, &b->jobs[i]);
}

static size_t family_count(void) {
  size_t n = 0;
  while (mj_kernel_families[n]) n++;
  return n;
}

/* Copies reports out and re-raises the first failure on this thread. */
static moejit_status finish_batch(kernel_job *jobs, size_t n, moejit_kernel_report *reports,
                                  size_t cap) {
  moejit_status first = MOEJIT_OK;
  for (size_t i = 0; i < n; i++) {
    if (i < cap) reports[i] = jobs[i].report;
    if (!first && jobs[i].report.status) {
      first = jobs[i].report.status;
      mj_fail(first, "%s", jobs[i].full_message ? jobs[i].full_message : jobs[i].report.message);
    }
    free(jobs[i].full_message);
  }
  return first;
}

moejit_status moejit_compile(moejit_compiler *c, const moejit_spec *spec, const char *arch,
                             moejit_kernel_report *reports, size_t cap, size_t *n_reports) {
  if (n_reports) *n_reports = 0;
  if (!c || !spec || (cap && !reports))
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_compile: missing argument");
  moejit_status s = moejit_spec_validate(spec);
  if (s) return s;
  const char *archs[MOEJIT_MAX_ARCHS];
  int n_archs = 0;
  batch b = {.c = c, .spec = spec};
  if ((s = request_archs(spec, arch, archs, &n_archs)) || (s = cache_resolve(c, spec, &b.cc)))
    return s;
  size_t nf = family_count(), n = nf * (size_t)n_archs;
  if (!(b.jobs = calloc(n, sizeof *b.jobs)))
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory planning %zu kernels", n);
  for (size_t i = 0; i < n; i++) {
    b.jobs[i].arch = archs[i / nf];
    b.jobs[i].family = mj_kernel_families[i % nf];
  }
  mj_parallel_for(n, c->jobs, batch_job, &b);
  s = finish_batch(b.jobs, n, reports, cap);
  if (n_reports) *n_reports = n;
  free(b.jobs);
  return s;
}

moejit_status mj_compiler_get_cubin(moejit_compiler *c, const moejit_spec *spec, const char *family,
                                    const char *arch, const void **cubin, size_t *len, char key[33],
                                    int *cache_hit) {
  return mj_compiler_get_cubin_entries(c, spec, family, arch, NULL, cubin, len, key, cache_hit);
}

moejit_status mj_compiler_get_cubin_entries(moejit_compiler *c, const moejit_spec *spec,
                                            const char *family, const char *arch,
                                            const mj_entry_set *only, const void **cubin,
                                            size_t *len, char key[33], int *cache_hit) {
  if (!c || !spec || !family || !arch || !cubin || !len)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "mj_compiler_get_cubin: missing argument");
  *cubin = NULL;
  *len = 0;
  cache_choice cc;
  moejit_status s = check_explicit_arch(arch);
  if (!s) s = cache_resolve(c, spec, &cc);
  if (s) return s;
  kernel_job job = {.family = family, .arch = arch, .only = only};
  run_job(c, spec, &cc, 0, &job);
  free(job.full_message); /* the message is still this thread's last error */
  if (job.report.status) return job.report.status;
  *cubin = job.entry->cubin;
  *len = job.entry->len;
  if (key) memcpy(key, job.report.key, 33);
  if (cache_hit) *cache_hit = job.report.cache_hit;
  return MOEJIT_OK;
}

moejit_status mj_compiler_generate(moejit_compiler *c, const moejit_spec *spec, const char *family,
                                   const char *arch, mj_kernel_source *out) {
  if (!c || !spec || !out)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "mj_compiler_generate: missing argument");
  if (!arch && spec->n_archs > 0) arch = spec->archs[0];
  if (!arch)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "the spec names no arch; HINT: pass an arch (e.g. sm_90a)");
  return mj_codegen(spec, family, arch, c->template_dir, out);
}

moejit_status moejit_generate(moejit_compiler *c, const moejit_spec *spec, const char *kernel,
                              const char *arch, char **source) {
  if (!source) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_generate: source is NULL");
  *source = NULL;
  mj_kernel_source ks;
  moejit_status s = c && spec && arch ? check_request_arch(spec, arch) : MOEJIT_OK;
  if (!s) s = mj_compiler_generate(c, spec, kernel, arch, &ks);
  if (s) return s;
  *source = ks.source;
  ks.source = NULL;
  mj_kernel_source_free(&ks);
  return MOEJIT_OK;
}
