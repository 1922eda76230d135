/* Thin stream and event wrappers: the ctx is made current around each
 * driver call and every failure gets a message. */
#include "common/common.h"
#include "runtime/runtime.h"
#include "runtime/runtime_impl.h"

/* Runs one driver call with the ctx pushed, recording a failure on ctx. */
#define WITH_CTX(ctx, call_expr, what)     \
  do {                                     \
    moejit_status st_ = mj_ctx_enter(ctx); \
    if (st_ != MOEJIT_OK) return st_;      \
    st_ = mj_cu_check((call_expr), what);  \
    mj_ctx_leave(ctx);                     \
    return mj_ctx_fail(ctx, st_);          \
  } while (0)

static moejit_status null_arg(moejit_ctx *ctx, const char *call, const char *name) {
  return mj_ctx_fail(ctx, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call, name));
}

moejit_status moejit_stream_create(moejit_ctx *ctx, moejit_stream *stream) {
  MJ_CHECK_CTX(ctx, "moejit_stream_create");
  if (!stream) return null_arg(ctx, "moejit_stream_create", "stream");
  *stream = NULL;
  WITH_CTX(ctx, ctx->d->StreamCreate((CUstream *)stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
}

moejit_status moejit_stream_destroy(moejit_ctx *ctx, moejit_stream stream) {
  MJ_CHECK_CTX(ctx, "moejit_stream_destroy");
  if (!stream) return MOEJIT_OK;
  WITH_CTX(ctx, ctx->d->StreamDestroy((CUstream)stream), "cuStreamDestroy");
}

moejit_status moejit_stream_synchronize(moejit_ctx *ctx, moejit_stream stream) {
  MJ_CHECK_CTX(ctx, "moejit_stream_synchronize");
  WITH_CTX(ctx, ctx->d->StreamSynchronize((CUstream)stream), "cuStreamSynchronize");
}

moejit_status moejit_event_create(moejit_ctx *ctx, moejit_event *event) {
  MJ_CHECK_CTX(ctx, "moejit_event_create");
  if (!event) return null_arg(ctx, "moejit_event_create", "event");
  *event = NULL;
  WITH_CTX(ctx, ctx->d->EventCreate((CUevent *)event, CU_EVENT_DEFAULT), "cuEventCreate");
}

moejit_status moejit_event_record(moejit_ctx *ctx, moejit_event event, moejit_stream stream) {
  MJ_CHECK_CTX(ctx, "moejit_event_record");
  if (!event) return null_arg(ctx, "moejit_event_record", "event");
  WITH_CTX(ctx, ctx->d->EventRecord((CUevent)event, (CUstream)stream), "cuEventRecord");
}

moejit_status moejit_event_synchronize(moejit_ctx *ctx, moejit_event event) {
  MJ_CHECK_CTX(ctx, "moejit_event_synchronize");
  if (!event) return null_arg(ctx, "moejit_event_synchronize", "event");
  WITH_CTX(ctx, ctx->d->EventSynchronize((CUevent)event), "cuEventSynchronize");
}

moejit_status moejit_event_elapsed_ms(moejit_ctx *ctx, moejit_event start, moejit_event end,
                                      float *ms) {
  MJ_CHECK_CTX(ctx, "moejit_event_elapsed_ms");
  if (!start) return null_arg(ctx, "moejit_event_elapsed_ms", "start");
  if (!end) return null_arg(ctx, "moejit_event_elapsed_ms", "end");
  if (!ms) return null_arg(ctx, "moejit_event_elapsed_ms", "ms");
  *ms = 0.0f;
  WITH_CTX(ctx, ctx->d->EventElapsedTime(ms, (CUevent)start, (CUevent)end), "cuEventElapsedTime");
}

moejit_status moejit_event_destroy(moejit_ctx *ctx, moejit_event event) {
  MJ_CHECK_CTX(ctx, "moejit_event_destroy");
  if (!event) return MOEJIT_OK;
  WITH_CTX(ctx, ctx->d->EventDestroy((CUevent)event), "cuEventDestroy");
}
