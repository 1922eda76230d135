/* chart.svg: one panel per (kernel, shape), median time against token
 * count on log-log axes; a thin polyline per tile config, the per-T winners
 * and the heuristic (path AUTO) drawn bold. Hand-written SVG, no deps. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "tune/tune.h"

#define PANEL_W 560
#define PANEL_H 380
#define MARGIN_L 70
#define MARGIN_R 20
#define MARGIN_T 56
#define MARGIN_B 48
#define COLUMNS 2
#define TITLE_H 40

typedef struct axes {
  double x0, y0;         /* panel origin in the picture */
  double lt_min, lt_max; /* log2 tokens */
  double lu_min, lu_max; /* log10 us */
} axes;

/* The measured rows of one panel, as indices into rows. */
typedef struct panel_rows {
  const mj_tune_row **r;
  size_t n;
} panel_rows;

static double px(const axes *a, int64_t tokens) {
  double w = PANEL_W - MARGIN_L - MARGIN_R, span = a->lt_max - a->lt_min;
  return a->x0 + MARGIN_L + (log2((double)tokens) - a->lt_min) / span * w;
}

static double py(const axes *a, double us) {
  double h = PANEL_H - MARGIN_T - MARGIN_B, span = a->lu_max - a->lu_min;
  return a->y0 + PANEL_H - MARGIN_B - (log10(us) - a->lu_min) / span * h;
}

static void xml_text(mj_buf *b, const char *s) {
  for (; *s; s++) {
    if (*s == '<')
      mj_buf_puts(b, "&lt;");
    else if (*s == '>')
      mj_buf_puts(b, "&gt;");
    else if (*s == '&')
      mj_buf_puts(b, "&amp;");
    else if (*s == '"')
      mj_buf_puts(b, "&quot;");
    else if ((unsigned char)*s >= 0x20)
      mj_buf_append(b, s, 1);
  }
}

static int same_panel(const mj_tune_row *a, const mj_tune_row *b) {
  return a->which == b->which && !strcmp(a->shape, b->shape);
}

static int same_series(const mj_tune_row *a, const mj_tune_row *b) {
  return a->role == b->role && a->path == b->path && !memcmp(&a->cfg, &b->cfg, sizeof a->cfg);
}

static int usable(const mj_tune_row *r) {
  return r->status == MJ_TS_OK && r->us > 0;
}

/* Axis ranges over the panel's measured rows; 0 when it has none. */
static int panel_range(const mj_tune_rows *rows, const mj_tune_row *p, axes *a) {
  double tmin = INFINITY, tmax = -INFINITY, umin = INFINITY, umax = -INFINITY;
  for (size_t i = 0; i < rows->n; i++) {
    const mj_tune_row *r = &rows->rows[i];
    if (!same_panel(r, p) || !usable(r)) continue;
    tmin = fmin(tmin, (double)r->tokens), tmax = fmax(tmax, (double)r->tokens);
    umin = fmin(umin, r->us), umax = fmax(umax, r->us);
  }
  if (!isfinite(tmin)) return 0;
  a->lt_min = log2(tmin), a->lt_max = log2(tmax);
  if (a->lt_max - a->lt_min < 1) a->lt_min -= 0.5, a->lt_max += 0.5;
  a->lu_min = floor(log10(umin) * 4) / 4, a->lu_max = ceil(log10(umax) * 4) / 4;
  if (a->lu_max - a->lu_min < 0.5) a->lu_min -= 0.25, a->lu_max += 0.25;
  return 1;
}

static void draw_axes(mj_buf *b, const panel_rows *pr, const mj_tune_row *p, const axes *a) {
  double left = a->x0 + MARGIN_L, right = a->x0 + PANEL_W - MARGIN_R;
  double top = a->y0 + MARGIN_T, bottom = a->y0 + PANEL_H - MARGIN_B;
  mj_buf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" class=\"frame\"/>\n",
                left, top, right - left, bottom - top);
  /* y: 1, 2, 5 x 10^n inside the range */
  for (int e = (int)floor(a->lu_min) - 1; e <= (int)ceil(a->lu_max); e++)
    for (int m = 1; m <= 5; m += (m == 1 ? 1 : 3)) {
      double us = m * pow(10, e), l = log10(us);
      if (l < a->lu_min - 1e-9 || l > a->lu_max + 1e-9) continue;
      double y = py(a, us);
      mj_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>",
                    left, y, right, y);
      mj_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" class=\"ytick\">%g</text>\n", left - 6, y + 4,
                    us);
    }
  /* x: every token count measured in this panel */
  int64_t drawn[MJ_SWEEP_MAX_TOKENS];
  int n = 0;
  for (size_t i = 0; i < pr->n; i++) {
    const mj_tune_row *r = pr->r[i];
    int seen = 0;
    for (int j = 0; j < n; j++) seen |= drawn[j] == r->tokens;
    if (seen || n == MJ_SWEEP_MAX_TOKENS) continue;
    drawn[n++] = r->tokens;
    double x = px(a, r->tokens);
    mj_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>", x,
                  top, x, bottom);
    mj_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" class=\"xtick\">%lld</text>\n", x, bottom + 16,
                  (long long)r->tokens);
  }
  mj_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" class=\"xlabel\">tokens T (log scale)</text>\n",
                (left + right) / 2, bottom + 36);
  mj_buf_printf(b,
                "<text x=\"%.1f\" y=\"%.1f\" class=\"ylabel\" transform=\"rotate(-90 %.1f %.1f)\">"
                "median time, us (log scale)</text>\n",
                a->x0 + 16, (top + bottom) / 2, a->x0 + 16, (top + bottom) / 2);
  mj_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" class=\"title\">gemm%d ", left, a->y0 + 20,
                p->which);
  xml_text(b, p->shape);
  mj_buf_printf(b, " (d=%lld f=%lld E=%d k=%d %s)</text>\n", (long long)p->hidden,
                (long long)p->expert_width, (int)p->experts, (int)p->top_k,
                moejit_dtype_name(p->dtype));
}

static void series_title(mj_buf *b, const mj_tune_row *r) {
  char cfg[64];
  moejit_gemm_cfg_text(&r->cfg, cfg, sizeof cfg);
  mj_buf_printf(b, "<title>%s %s%s</title>", cfg, moejit_gemm_path_name(r->path),
                r->role == MJ_ROLE_HEURISTIC ? " (heuristic)" : "");
}

/* One polyline per config over the token counts it ran at (rows are in
 * token order within a series, as the engine writes them). */
static void draw_series(mj_buf *b, const panel_rows *pr, const axes *a, mj_tune_role role,
                        const char *cls) {
  for (size_t i = 0; i < pr->n; i++) {
    const mj_tune_row *s = pr->r[i];
    if (s->role != role) continue;
    int first = 1;
    for (size_t j = 0; j < i && first; j++) first = !same_series(pr->r[j], s);
    if (!first) continue;
    mj_buf_printf(b, "<polyline class=\"%s\" points=\"", cls);
    for (size_t j = i; j < pr->n; j++)
      if (same_series(pr->r[j], s))
        mj_buf_printf(b, "%.1f,%.1f ", px(a, pr->r[j]->tokens), py(a, pr->r[j]->us));
    mj_buf_puts(b, "\">");
    series_title(b, s);
    mj_buf_puts(b, "</polyline>\n");
  }
}

/* The fastest candidate at each token count, joined. */
static void draw_winners(mj_buf *b, const panel_rows *pr, const axes *a) {
  const mj_tune_row *best[MJ_SWEEP_MAX_TOKENS];
  int n = 0;
  for (size_t i = 0; i < pr->n; i++) {
    const mj_tune_row *r = pr->r[i];
    if (r->role != MJ_ROLE_CANDIDATE) continue;
    int j = 0;
    while (j < n && best[j]->tokens != r->tokens) j++;
    if (j == n && n < MJ_SWEEP_MAX_TOKENS)
      best[n++] = r;
    else if (j < n && r->us < best[j]->us)
      best[j] = r;
  }
  for (int i = 1; i < n; i++) /* token order */
    for (int j = i; j > 0 && best[j]->tokens < best[j - 1]->tokens; j--) {
      const mj_tune_row *t = best[j];
      best[j] = best[j - 1], best[j - 1] = t;
    }
  mj_buf_puts(b, "<polyline class=\"winner\" points=\"");
  for (int i = 0; i < n; i++)
    mj_buf_printf(b, "%.1f,%.1f ", px(a, best[i]->tokens), py(a, best[i]->us));
  mj_buf_puts(b, "\"/>\n");
  for (int i = 0; i < n; i++) {
    mj_buf_printf(b, "<circle class=\"winner-dot\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\">",
                  px(a, best[i]->tokens), py(a, best[i]->us));
    char cfg[64];
    moejit_gemm_cfg_text(&best[i]->cfg, cfg, sizeof cfg);
    mj_buf_printf(b, "<title>T=%lld: %s %s, %.1f us</title></circle>\n", (long long)best[i]->tokens,
                  cfg, moejit_gemm_path_name(best[i]->path), best[i]->us);
  }
}

static void draw_legend(mj_buf *b, const axes *a) {
  double x = a->x0 + MARGIN_L, y = a->y0 + 40;
  static const char *const cls[] = {"winner", "heuristic", "cand"};
  static const char *const label[] = {"best per T (tuned)", "heuristic (auto)", "other configs"};
  for (int i = 0; i < 3; i++, x += 150) {
    mj_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"%s\"/>", x,
                  y - 4, x + 22, y - 4, cls[i]);
    mj_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" class=\"legend\">%s</text>\n", x + 28, y,
                  label[i]);
  }
}

static const char kStyle[] =
    "<style>\n"
    "text{font-family:sans-serif;font-size:12px;fill:#222}\n"
    ".title{font-size:14px;font-weight:bold}\n"
    ".heading{font-size:16px;font-weight:bold}\n"
    ".frame{fill:#fff;stroke:#888}\n"
    ".grid{stroke:#e4e4e4}\n"
    ".ytick{text-anchor:end}.xtick,.xlabel,.ylabel{text-anchor:middle}\n"
    ".cand{fill:none;stroke:#999;stroke-width:1;opacity:.45}\n"
    ".cand:hover{stroke:#000;opacity:1;stroke-width:2}\n"
    ".heuristic{fill:none;stroke:#1f5fbf;stroke-width:2.5;stroke-dasharray:6 4}\n"
    ".winner{fill:none;stroke:#d62728;stroke-width:3}\n"
    ".winner-dot{fill:#d62728}\n"
    ".empty{fill:#888}\n"
    "</style>\n";

moejit_status mj_tune_write_svg(const mj_tune_rows *rows, const mj_tune_meta *m, const char *path) {
  const mj_tune_row *panels[2 * MJ_SWEEP_MAX_SHAPES];
  int n = 0;
  for (size_t i = 0; i < rows->n && n < (int)MJ_ARRAY_LEN(panels); i++) {
    int seen = 0;
    for (int j = 0; j < n; j++) seen |= same_panel(panels[j], &rows->rows[i]);
    if (!seen) panels[n++] = &rows->rows[i];
  }
  int cols = n < COLUMNS ? (n ? n : 1) : COLUMNS, lines = (n + cols - 1) / cols;
  panel_rows pr = {calloc(rows->n ? rows->n : 1, sizeof *pr.r), 0};
  if (!pr.r) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory writing %s", path);
  mj_buf b = {0};
  mj_buf_printf(&b,
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                "viewBox=\"0 0 %d %d\">\n",
                cols * PANEL_W, TITLE_H + (lines ? lines : 1) * PANEL_H, cols * PANEL_W,
                TITLE_H + (lines ? lines : 1) * PANEL_H);
  mj_buf_puts(&b, kStyle);
  mj_buf_puts(&b, "<rect width=\"100%\" height=\"100%\" fill=\"#fafafa\"/>\n");
  mj_buf_puts(&b, "<text x=\"16\" y=\"26\" class=\"heading\">moejit tune: ");
  xml_text(&b, m->sweep ? m->sweep : "");
  mj_buf_puts(&b, " on ");
  xml_text(&b, m->device && *m->device ? m->device : "(no GPU)");
  mj_buf_printf(&b, " (%s, NVRTC %s, %s)</text>\n", m->arch ? m->arch : "",
                m->nvrtc ? m->nvrtc : "", m->date ? m->date : "");
  for (int i = 0; i < n; i++) {
    axes a = {.x0 = (double)(i % cols) * PANEL_W, .y0 = TITLE_H + (double)(i / cols) * PANEL_H};
    mj_buf_puts(&b, "<g>\n");
    if (!panel_range(rows, panels[i], &a)) {
      mj_buf_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" class=\"title\">gemm%d ", a.x0 + MARGIN_L,
                    a.y0 + 20, panels[i]->which);
      xml_text(&b, panels[i]->shape);
      mj_buf_printf(&b,
                    "</text><text x=\"%.1f\" y=\"%.1f\" class=\"empty\">no measured "
                    "candidates</text>\n</g>\n",
                    a.x0 + MARGIN_L, a.y0 + 60);
      continue;
    }
    pr.n = 0;
    for (size_t j = 0; j < rows->n; j++)
      if (same_panel(&rows->rows[j], panels[i]) && usable(&rows->rows[j]))
        pr.r[pr.n++] = &rows->rows[j];
    draw_axes(&b, &pr, panels[i], &a);
    draw_legend(&b, &a);
    draw_series(&b, &pr, &a, MJ_ROLE_CANDIDATE, "cand");
    draw_series(&b, &pr, &a, MJ_ROLE_HEURISTIC, "heuristic");
    draw_winners(&b, &pr, &a);
    mj_buf_puts(&b, "</g>\n");
  }
  mj_buf_puts(&b, "</svg>\n");
  moejit_status st = b.oom ? mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory writing %s", path)
                           : mj_write_file_atomic(path, b.data, b.len);
  mj_buf_free(&b);
  free(pr.r);
  return st;
}
