/* Helpers for the code generator and compiler tests: random valid specs,
 * paths of the test-only templates, and a check that every line of a
 * generated source maps back (through its #line markers) to its template. */
#ifndef MOEJIT_CODEGEN_SUPPORT_H
#define MOEJIT_CODEGEN_SUPPORT_H

#include <stddef.h>

#include "moejit/moejit.h"
#include "test_support.h"

/* A valid spec with a random shape, routing, dtypes and block sizes. */
void cs_random_spec(ts_rng *r, moejit_spec *spec);
/* cs_random_spec from a fresh generator named `tag` (its seed is printed). */
moejit_spec cs_fresh_spec(const char *tag);

/* Absolute path of tests/data/templates/<name> (static buffer per call). */
const char *cs_template_dir(const char *name);

/* Walks `source` line by line after the first #line marker and checks that
 * each line equals the line of the template file the marker names (include
 * and #pragma once lines must appear as "// <original> (why)"). template_dir
 * NULL: the embedded templates. Returns 0 on success, else writes the first mismatch to why. */
int cs_check_line_mapping(const char *source, const char *template_dir, char *why, size_t cap);

#endif
