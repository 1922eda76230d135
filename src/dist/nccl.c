/* NCCL loader (src/dist/nccl.h): dlopen once, resolve the entry points
 * expert parallelism calls, turn ncclResult_t into moejit errors. */
#include "dist/nccl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

static struct {
  pthread_once_t once;
  void *lib;
  mj_nccl table;
  moejit_status status;
  char message[1024];
} nccl = {.once = PTHREAD_ONCE_INIT};

typedef struct nccl_symbol {
  const char *name;
  size_t offset;
  int optional;
} nccl_symbol;

#define NSYM(member, name) {name, offsetof(mj_nccl, member), 0}
static const nccl_symbol nccl_symbols[] = {
    NSYM(GetVersion, "ncclGetVersion"),
    NSYM(GetUniqueId, "ncclGetUniqueId"),
    NSYM(CommInitRank, "ncclCommInitRank"),
    {"ncclCommInitRankConfig", offsetof(mj_nccl, CommInitRankConfig), 1},
    {"ncclCommFinalize", offsetof(mj_nccl, CommFinalize), 1},
    NSYM(CommDestroy, "ncclCommDestroy"),
    NSYM(CommAbort, "ncclCommAbort"),
    NSYM(CommCount, "ncclCommCount"),
    NSYM(CommUserRank, "ncclCommUserRank"),
    NSYM(CommCuDevice, "ncclCommCuDevice"),
    NSYM(CommGetAsyncError, "ncclCommGetAsyncError"),
    NSYM(GetErrorString, "ncclGetErrorString"),
    {"ncclGetLastError", offsetof(mj_nccl, GetLastError), 1},
    NSYM(GroupStart, "ncclGroupStart"),
    NSYM(GroupEnd, "ncclGroupEnd"),
    NSYM(Send, "ncclSend"),
    NSYM(Recv, "ncclRecv"),
};

#define MJ_NCCL_HINT                                                                      \
  "HINT: expert parallelism needs NCCL 2.9 or newer: install it (libnccl2, or the "     \
  "nvidia-nccl wheel) and put libnccl.so.2 on the loader path, or set "                  \
  "MOEJIT_NCCL_LIBRARY to its full path; everything else in moejit works without NCCL"

static void fail_load(const char *why) {
  nccl.status = MOEJIT_ERR_UNSUPPORTED;
  /* the reason is capped so that the hint always fits */
  snprintf(nccl.message, sizeof nccl.message, "NCCL is not available (%.600s); " MJ_NCCL_HINT, why);
  if (nccl.lib) dlclose(nccl.lib);
  nccl.lib = NULL;
}

static void load_nccl(void) {
  const char *env = getenv("MOEJIT_NCCL_LIBRARY");
  const char *tried[3] = {NULL, NULL, NULL};
  if (env && *env)
    tried[0] = env;
  else
    tried[0] = "libnccl.so.2", tried[1] = "libnccl.so";
  char errs[800] = "";
  size_t used = 0;
  for (int i = 0; i < 3 && tried[i] && !nccl.lib; i++) {
    nccl.lib = dlopen(tried[i], RTLD_NOW | RTLD_LOCAL);
    if (!nccl.lib && used < sizeof errs) {
      const char *e = dlerror();
      used += (size_t)snprintf(errs + used, sizeof errs - used, "%s%s", used ? "; " : "",
                               e ? e : tried[i]);
    }
  }
  if (!nccl.lib) return fail_load(errs);
  for (size_t i = 0; i < MJ_ARRAY_LEN(nccl_symbols); i++) {
    void *fn = dlsym(nccl.lib, nccl_symbols[i].name);
    if (!fn && !nccl_symbols[i].optional) {
      char why[256];
      snprintf(why, sizeof why, "the library lacks %s", nccl_symbols[i].name);
      return fail_load(why);
    }
    memcpy((char *)&nccl.table + nccl_symbols[i].offset, &fn, sizeof fn);
  }
  int v = 0;
  const mj_nccl_result r = nccl.table.GetVersion(&v);
  char why[192];
  if (r != MJ_NCCL_SUCCESS) {
    snprintf(why, sizeof why, "ncclGetVersion failed: NCCL error %d", (int)r);
    return fail_load(why);
  }
  /* NCCL's version code: X*10000 + Y*100 + Z from 2.9 on, X*1000 + Y*100 + Z before */
  if (v < MJ_NCCL_MIN_VERSION) {
    const int old = v < 10000;
    snprintf(why, sizeof why,
             "NCCL %d.%d.%d (ncclGetVersion %d) is too old: need 2.9.0 or newer, whose send and "
             "recv can be captured in a CUDA graph",
             old ? v / 1000 : v / 10000, old ? (v / 100) % 10 : (v / 100) % 100, v % 100, v);
    return fail_load(why);
  }
  nccl.table.version = v;
  nccl.status = MOEJIT_OK;
}

moejit_status mj_nccl_get(const mj_nccl **out) {
  pthread_once(&nccl.once, load_nccl);
  if (nccl.status) {
    if (out) *out = NULL;
    return mj_fail(nccl.status, "%s", nccl.message);
  }
  if (out) *out = &nccl.table;
  return MOEJIT_OK;
}

int mj_nccl_has_nonblocking(const mj_nccl *n) {
  return n->version >= MJ_NCCL_NONBLOCKING_VERSION && n->CommInitRankConfig && n->CommFinalize;
}

mj_nccl_result mj_nccl_state(const mj_nccl *n, mj_nccl_comm comm) {
  mj_nccl_result async = MJ_NCCL_IN_PROGRESS;
  const mj_nccl_result r = n->CommGetAsyncError(comm, &async);
  return r != MJ_NCCL_SUCCESS ? r : async;
}

void mj_nccl_config_nonblocking(mj_nccl_config *c) {
  memset(c, 0, sizeof *c);
  c->size = sizeof *c;
  c->magic = MJ_NCCL_CONFIG_MAGIC;
  c->version = MJ_NCCL_NONBLOCKING_VERSION; /* the layout above is 2.14's */
  c->blocking = 0;
  c->cga_cluster_size = c->min_ctas = c->max_ctas = MJ_NCCL_CONFIG_UNDEF_INT;
  c->net_name = NULL;
}

moejit_status mj_nccl_check(const mj_nccl *n, mj_nccl_result r, mj_nccl_comm comm,
                            const char *what) {
  if (r == MJ_NCCL_SUCCESS) return MOEJIT_OK;
  const char *s = n->GetErrorString ? n->GetErrorString(r) : "unknown";
  const char *last = comm && n->GetLastError ? n->GetLastError(comm) : NULL;
  return mj_fail(MOEJIT_ERR_CUDA, "%s: NCCL error %d (%s)%s%s", what, (int)r, s ? s : "unknown",
                 last && *last ? ": " : "", last && *last ? last : "");
}

/* ---- public: version, unique ids ---------------------------------------- */

moejit_status moejit_nccl_version(int *version) {
  if (version) *version = 0;
  if (!version) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_nccl_version: version is NULL");
  const mj_nccl *n;
  moejit_status st = mj_nccl_get(&n);
  if (st) return st;
  *version = n->version;
  return MOEJIT_OK;
}

moejit_status moejit_nccl_unique_id(moejit_nccl_id *id) {
  if (!id) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_nccl_unique_id: id is NULL");
  const mj_nccl *n;
  moejit_status st = mj_nccl_get(&n);
  if (st) return st;
  mj_nccl_unique_id u;
  if ((st = mj_nccl_check(n, n->GetUniqueId(&u), NULL, "ncclGetUniqueId"))) return st;
  memcpy(id->bytes, u.internal, sizeof id->bytes);
  return MOEJIT_OK;
}
