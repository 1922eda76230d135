/* Links the installed moejit and checks that the linked library matches
 * the header it was built against and that a preset loads. */
#include <moejit/moejit.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  if (moejit_version_number() != MOEJIT_VERSION_NUMBER) {
    fprintf(stderr, "header %d != library %u\n", MOEJIT_VERSION_NUMBER, moejit_version_number());
    return 1;
  }
  moejit_spec spec;
  if (moejit_spec_load_preset(moejit_default_preset(), &spec) != MOEJIT_OK) {
    fprintf(stderr, "preset: %s\n", moejit_last_error());
    return 1;
  }
  printf("consumer ok: moejit %s, preset %s E=%d k=%d\n", moejit_version_string(), spec.name,
         (int)spec.experts, (int)spec.top_k);
  return strcmp(moejit_status_str(MOEJIT_OK), "ok") == 0 ? 0 : 1;
}
