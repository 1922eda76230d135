/* Internal face of the config layer: spec defaults and validation, the
 * YAML loader, embedded presets, and helpers other layers use to describe
 * a spec. The public calls (moejit_spec_*) are thin wrappers over these. */
#ifndef MOEJIT_CONFIG_H
#define MOEJIT_CONFIG_H

#include <stdarg.h>

#include "moejit/moejit.h"

/* One-line description used in cache metadata and CLI tables:
 * "qwen3-30b-a3b d=2048 f=768 E=128 k=8 softmax bf16". */
void mj_spec_summary(const moejit_spec *spec, char *buf, size_t cap);

/* A copy of `in` whose bytes without meaning (after a string's NUL,
 * padding) are zero: equal specs compare (and hash) equal byte for byte. */
void mj_spec_canonical(const moejit_spec *in, moejit_spec *out);

/* Arch strings: "sm_80", "sm_90a", ... Returns the numeric compute
 * capability (80, 90) and whether the 'a' suffix is present; 0 if the text
 * is not an arch name. "auto" returns 0. */
int mj_arch_parse(const char *arch, int *has_a_suffix);

/* The shared memory one block may opt into on arch, in bytes: 163 KiB on
 * sm_80 and sm_87, 99 KiB on sm_86, sm_89 and sm_12x, 227 KiB on sm_90,
 * sm_100, sm_103 and sm_110 (the CUDA programming guide's table by compute
 * capability); 0 for "auto", NULL or an arch not in the table. */
int mj_arch_smem_optin(const char *arch);

/* 1 when arch is one a config may name as target.arch, "auto" aside
 * (mj_arch_allowed lists them): sm_75 or sm_80a are not. */
int mj_arch_supported(const char *arch);

/* Shared-memory bytes a GEMM tile config needs for its pipeline stages
 * (A and B tiles per stage), given the operand dtype size. */
size_t mj_gemm_smem_bytes(const moejit_gemm_cfg *g, size_t elem_bytes);

/* Embedded preset table (generated at build time from configs/models/). */
typedef struct mj_embedded_file {
  const char *name; /* "qwen3-30b-a3b" or "route.cu" */
  const char *text;
  size_t len;
} mj_embedded_file;
extern const mj_embedded_file mj_embedded_presets[];
extern const size_t mj_embedded_presets_count;
/* The tuned tables of configs/tuned/, named by file name ("NVIDIA_H100_80GB_HBM3.yaml"). */
extern const mj_embedded_file mj_embedded_tuned[];
extern const size_t mj_embedded_tuned_count;

/* ------------------------------------------------------------------------ */
/* Internal to src/config: loader limits, the YAML tree, the rule checker.  */
/* ------------------------------------------------------------------------ */

/* Loader limits (docs/config.md): input size, container nesting, nodes. */
#define MJ_CONFIG_MAX_BYTES ((size_t)1 << 20)
#define MJ_CONFIG_MAX_DEPTH 16
#define MJ_CONFIG_MAX_NODES 10000

/* A YAML node built from libyaml events, with its 1-based start mark. */
typedef enum mj_yaml_kind { MJ_YAML_SCALAR, MJ_YAML_MAP, MJ_YAML_SEQ } mj_yaml_kind;
typedef struct mj_yaml_node {
  mj_yaml_kind kind;
  int line, col;
  int plain;  /* scalar written without quotes or block style */
  char *text; /* scalar text, NUL-terminated (may hold inner NULs: see len) */
  size_t len;
  struct mj_yaml_node **items; /* map: key, value, key, value...; seq: items */
  size_t n_items, cap_items;
} mj_yaml_node;

/* Parses one YAML document into a tree. Rejects aliases, tags, nesting past
 * MJ_CONFIG_MAX_DEPTH, more than MJ_CONFIG_MAX_NODES nodes, several
 * documents. *root is NULL for an empty stream. CONFIG errors read
 * "ORIGIN:LINE:COL: ...". */
moejit_status mj_yaml_parse(const char *text, size_t len, const char *origin, mj_yaml_node **root);
/* The same with another node limit (tuned tables hold thousands of
 * entries). */
moejit_status mj_yaml_parse_max(const char *text, size_t len, const char *origin, size_t max_nodes,
                                mj_yaml_node **root);
void mj_yaml_free(mj_yaml_node *node);

/* Helpers every reader of a YAML tree shares (the config loader, tuned
 * tables, sweeps). */
/* A plain scalar that YAML reads as null: empty, ~, null, Null, NULL. */
int mj_yaml_is_null(const mj_yaml_node *n);
/* What a node is, for "expected X, got Y": "a mapping", "a list", "an empty
 * value (null)", "'abc'", "the quoted string '2048'". */
void mj_yaml_describe(const mj_yaml_node *n, char *buf, size_t cap);
/* CONFIG error "ORIGIN:LINE:COL: PATH: message" at node n (1:1 when n is
 * NULL; no "PATH: " when path is NULL or empty). */
moejit_status mj_yaml_vfail(const char *origin, const mj_yaml_node *n, const char *path,
                            const char *fmt, va_list ap);

/* Every checked field of a spec, for messages and positions. */
/* clang-format off */
typedef enum mj_field {
  MJ_F_NAME,
  MJ_F_HIDDEN, MJ_F_EXPERT_WIDTH, MJ_F_EXPERTS, MJ_F_TOP_K,
  MJ_F_RULE, MJ_F_RENORMALIZE, MJ_F_N_GROUP, MJ_F_TOPK_GROUP, MJ_F_SCALING,
  MJ_F_ACT, MJ_F_WEIGHT, MJ_F_LOGITS, MJ_F_OUTPUT,
  MJ_F_ARCH0, MJ_F_ARCH1, MJ_F_ARCH2, MJ_F_ARCH3,
  MJ_F_ROUTE_THREADS, MJ_F_ALIGN_THREADS, MJ_F_COMBINE_THREADS,
  MJ_F_GEMM1, /* first of MJ_GEMM_NFIELDS per GEMM: tile_m tile_n tile_k stages warps
                 cluster_m cluster_n raster schedule */
  MJ_F_GEMM2 = MJ_F_GEMM1 + 9,
  MJ_F_CACHE_DIR = MJ_F_GEMM2 + 9,
  MJ_F_CACHE_MAX,
  MJ_F_COUNT
} mj_field;
/* clang-format on */
#define MJ_GEMM_TILE_M 0
#define MJ_GEMM_TILE_N 1
#define MJ_GEMM_TILE_K 2
#define MJ_GEMM_STAGES 3
#define MJ_GEMM_WARPS 4
#define MJ_GEMM_CLUSTER_M 5
#define MJ_GEMM_CLUSTER_N 6
#define MJ_GEMM_RASTER 7
#define MJ_GEMM_SCHEDULE 8
#define MJ_GEMM_NFIELDS 9

/* Key path of a field ("model.top_k") and what it allows. */
const char *mj_field_path(mj_field f);
const char *mj_field_allowed(mj_field f);
/* Integer-valued fields (shape, routing counts, enums, kernel shapes) read
 * and written as int64; other fields return 0 / are ignored. */
int64_t mj_spec_get_int(const moejit_spec *spec, mj_field f);
void mj_spec_set_int(moejit_spec *spec, mj_field f, int64_t v);

/* Where each field was given in a YAML file, so that the checker's messages
 * read "ORIGIN:LINE:COL: ...". line 0: not given. `wide` holds integers as
 * written (they may not fit the spec's narrower fields until checked). */
typedef struct mj_mark {
  int line, col;
} mj_mark;
typedef struct mj_spec_marks {
  const char *origin;
  mj_mark root;                /* the top-level mapping */
  mj_mark field[MJ_F_COUNT];   /* the value's start */
  mj_mark section[MJ_F_COUNT]; /* the mapping holding the field, if given */
  int64_t wide[MJ_F_COUNT];
  unsigned char has_wide[MJ_F_COUNT];
  double scaling_wide; /* routing.scaling_factor as written */
  int has_scaling_wide;
  int arch_is_list; /* target.arch given as a list: paths read "target.arch[i]" */
} mj_spec_marks;

/* Every per-field and cross-field rule. marks NULL: messages name the field
 * only (moejit_spec_validate); else they start with the position of the
 * latest-written field involved. */
moejit_status mj_spec_check(const moejit_spec *spec, const mj_spec_marks *marks);

/* Writes s[0..len) quoted for a message: 'text', non-printable bytes as
 * \xNN, long text cut with "...". */
void mj_quote(char *buf, size_t cap, const char *s, size_t len);

/* Arch names the validator accepts ("sm_80 sm_86 ... auto"). */
const char *mj_arch_allowed(void);

/* The names of moejit_gemm_schedule as YAML, the CLI, CSV and JSON write
 * them, indexed by value (moejit_gemm_schedule_name reads this table), and
 * the same names as a message's "allowed ..." list. Every parser and writer
 * of schedules uses these. */
#define MJ_SCHEDULE_COUNT 2
extern const char *const mj_schedule_names[MJ_SCHEDULE_COUNT];
#define MJ_SCHEDULE_ALLOWED "cooperative, pingpong"
/* Output columns of one GEMM tile: GEMM 1's tile_n counts gate + up rows,
 * so half of them are h columns; GEMM 2's are y columns. */
static inline int64_t mj_gemm_out_cols(int which, int64_t tile_n) {
  return which == 1 ? tile_n / 2 : tile_n;
}
/* The n-tiles over n_out output columns (0 for a tile without columns). */
static inline int64_t mj_gemm_n_tiles(int which, int64_t n_out, int64_t tile_n) {
  const int64_t cols = mj_gemm_out_cols(which, tile_n);
  return cols > 0 ? (n_out + cols - 1) / cols : 0;
}

/* 1 when v is a moejit_gemm_schedule value. */
static inline int mj_schedule_valid(int64_t v) {
  return v >= 0 && v < MJ_SCHEDULE_COUNT;
}

#endif
