/* YAML text -> a small tree of nodes with line/column marks, built from
 * libyaml's event parser so that limits (depth, node count, no aliases) are
 * enforced before anything large is built. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "common/common.h"
#include "config/config.h"

typedef struct builder {
  const char *origin;
  const char *text;
  size_t len;
  mj_yaml_node *stack[MJ_CONFIG_MAX_DEPTH];
  int depth;
  mj_yaml_node *root;
  size_t nodes, max_nodes;
  int documents;
} builder;

void mj_yaml_free(mj_yaml_node *node) {
  if (!node) return;
  for (size_t i = 0; i < node->n_items; i++) mj_yaml_free(node->items[i]);
  free(node->items);
  free(node->text);
  free(node);
}

__attribute__((format(printf, 3, 4))) static moejit_status fail_at(const builder *b,
                                                                   yaml_mark_t mark,
                                                                   const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mj_fail(MOEJIT_ERR_CONFIG, "%s:%d:%d: %s", b->origin, (int)mark.line + 1,
                 (int)mark.column + 1, msg);
}

/* libyaml reports reader errors (bad UTF-8, control bytes) as an offset. */
static void offset_to_mark(const builder *b, size_t offset, int *line, int *col) {
  *line = 1, *col = 1;
  for (size_t i = 0; i < offset && i < b->len; i++) {
    if (b->text[i] == '\n')
      ++*line, *col = 1;
    else if (((unsigned char)b->text[i] & 0xc0) != 0x80)
      ++*col; /* count characters */
  }
}

static moejit_status libyaml_error(const builder *b, const yaml_parser_t *p) {
  if (p->error == YAML_MEMORY_ERROR)
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "%s: out of memory while parsing YAML", b->origin);
  const char *problem = p->problem ? p->problem : "unknown problem";
  int line, col;
  if (p->error == YAML_READER_ERROR) {
    offset_to_mark(b, p->problem_offset, &line, &col);
    return mj_fail(MOEJIT_ERR_CONFIG,
                   "%s:%d:%d: malformed YAML: %s (byte offset %zu); HINT: "
                   "configs are UTF-8 text without control characters",
                   b->origin, line, col, problem, p->problem_offset);
  }
  line = (int)p->problem_mark.line + 1, col = (int)p->problem_mark.column + 1;
  if (p->context)
    return mj_fail(MOEJIT_ERR_CONFIG, "%s:%d:%d: malformed YAML: %s (%s, which began at %d:%d)",
                   b->origin, line, col, problem, p->context, (int)p->context_mark.line + 1,
                   (int)p->context_mark.column + 1);
  return mj_fail(MOEJIT_ERR_CONFIG, "%s:%d:%d: malformed YAML: %s", b->origin, line, col, problem);
}

static moejit_status append_child(mj_yaml_node *parent, mj_yaml_node *child) {
  if (parent->n_items == parent->cap_items) {
    size_t cap = parent->cap_items ? parent->cap_items * 2 : 8;
    mj_yaml_node **items = realloc(parent->items, cap * sizeof *items);
    if (!items) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory building the YAML tree");
    parent->items = items, parent->cap_items = cap;
  }
  parent->items[parent->n_items++] = child;
  return MOEJIT_OK;
}

/* Makes a node at the event's mark and hangs it under the open container
 * (or makes it the root). */
static moejit_status add_node(builder *b, const yaml_event_t *ev, mj_yaml_kind kind,
                              mj_yaml_node **out) {
  if (b->nodes >= b->max_nodes) {
    return fail_at(b, ev->start_mark,
                   "too many YAML nodes (the limit is %zu; a config needs about 100)",
                   b->max_nodes);
  }
  mj_yaml_node *n = calloc(1, sizeof *n);
  if (!n) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory building the YAML tree");
  n->kind = kind;
  n->line = (int)ev->start_mark.line + 1;
  n->col = (int)ev->start_mark.column + 1;
  b->nodes++;
  moejit_status st = b->depth ? append_child(b->stack[b->depth - 1], n) : MOEJIT_OK;
  if (st) {
    free(n);
    return st;
  }
  if (!b->depth) b->root = n;
  *out = n;
  return MOEJIT_OK;
}

static moejit_status add_scalar(builder *b, const yaml_event_t *ev) {
  mj_yaml_node *n;
  moejit_status st = add_node(b, ev, MJ_YAML_SCALAR, &n);
  if (st) return st;
  size_t len = ev->data.scalar.length;
  n->text = malloc(len + 1);
  if (!n->text) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory building the YAML tree");
  memcpy(n->text, ev->data.scalar.value, len);
  n->text[len] = '\0';
  n->len = len;
  n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
  return MOEJIT_OK;
}

static moejit_status open_container(builder *b, const yaml_event_t *ev, mj_yaml_kind kind) {
  if (b->depth >= MJ_CONFIG_MAX_DEPTH) {
    return fail_at(b, ev->start_mark, "nesting is deeper than %d levels (the loader's limit)",
                   MJ_CONFIG_MAX_DEPTH);
  }
  mj_yaml_node *n;
  moejit_status st = add_node(b, ev, kind, &n);
  if (st) return st;
  b->stack[b->depth++] = n;
  return MOEJIT_OK;
}

/* The tag an event carries, if the text wrote one explicitly. */
static const yaml_char_t *explicit_tag(const yaml_event_t *ev) {
  switch (ev->type) {
    case YAML_SCALAR_EVENT:
      return ev->data.scalar.plain_implicit || ev->data.scalar.quoted_implicit
                 ? NULL
                 : ev->data.scalar.tag;
    case YAML_SEQUENCE_START_EVENT:
      return ev->data.sequence_start.implicit ? NULL : ev->data.sequence_start.tag;
    case YAML_MAPPING_START_EVENT:
      return ev->data.mapping_start.implicit ? NULL : ev->data.mapping_start.tag;
    default:
      return NULL;
  }
}

static moejit_status on_event(builder *b, const yaml_event_t *ev) {
  const yaml_char_t *tag = explicit_tag(ev);
  if (tag)
    return fail_at(b, ev->start_mark, "tags such as '%s' are not supported; write plain values",
                   (const char *)tag);
  switch (ev->type) {
    case YAML_DOCUMENT_START_EVENT:
      if (++b->documents > 1)
        return fail_at(
            b, ev->start_mark,
            "a config holds one YAML document; remove the second '---' and what follows");
      return MOEJIT_OK;
    case YAML_ALIAS_EVENT:
      return fail_at(
          b, ev->start_mark,
          "aliases (*%s) are not supported; write the value out (aliases can blow a small "
          "file up into a huge one)",
          (const char *)ev->data.alias.anchor);
    case YAML_SCALAR_EVENT:
      return add_scalar(b, ev);
    case YAML_SEQUENCE_START_EVENT:
      return open_container(b, ev, MJ_YAML_SEQ);
    case YAML_MAPPING_START_EVENT:
      return open_container(b, ev, MJ_YAML_MAP);
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT:
      if (b->depth > 0) b->depth--;
      return MOEJIT_OK;
    default:
      return MOEJIT_OK;
  }
}

moejit_status mj_yaml_parse(const char *text, size_t len, const char *origin, mj_yaml_node **root) {
  return mj_yaml_parse_max(text, len, origin, MJ_CONFIG_MAX_NODES, root);
}

moejit_status mj_yaml_parse_max(const char *text, size_t len, const char *origin, size_t max_nodes,
                                mj_yaml_node **root) {
  builder b = {.origin = origin, .text = text, .len = len, .max_nodes = max_nodes};
  yaml_parser_t parser;
  *root = NULL;
  if (!yaml_parser_initialize(&parser))
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "%s: cannot initialise the YAML parser", origin);
  yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
  moejit_status st = MOEJIT_OK;
  for (int done = 0; !done && !st;) {
    yaml_event_t ev;
    if (!yaml_parser_parse(&parser, &ev)) {
      st = libyaml_error(&b, &parser);
      break;
    }
    st = on_event(&b, &ev);
    done = ev.type == YAML_STREAM_END_EVENT;
    yaml_event_delete(&ev);
  }
  yaml_parser_delete(&parser);
  if (st) {
    mj_yaml_free(b.root);
    return st;
  }
  *root = b.root;
  return MOEJIT_OK;
}

int mj_yaml_is_null(const mj_yaml_node *n) {
  if (n->kind != MJ_YAML_SCALAR || !n->plain) return 0;
  return n->len == 0 || !strcmp(n->text, "~") || !strcmp(n->text, "null") ||
         !strcmp(n->text, "Null") || !strcmp(n->text, "NULL");
}

void mj_yaml_describe(const mj_yaml_node *n, char *buf, size_t cap) {
  char q[256];
  if (n->kind == MJ_YAML_MAP)
    snprintf(buf, cap, "a mapping");
  else if (n->kind == MJ_YAML_SEQ)
    snprintf(buf, cap, "a list");
  else if (mj_yaml_is_null(n))
    snprintf(buf, cap, "an empty value (null)");
  else {
    mj_quote(q, sizeof q, n->text, n->len);
    snprintf(buf, cap, n->plain ? "%s" : "the quoted string %s", q);
  }
}

moejit_status mj_yaml_vfail(const char *origin, const mj_yaml_node *n, const char *path,
                            const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  const int has_path = path && *path;
  return mj_fail(MOEJIT_ERR_CONFIG, "%s:%d:%d: %s%s%s", origin, n ? n->line : 1, n ? n->col : 1,
                 has_path ? path : "", has_path ? ": " : "", msg);
}
