/* gpufl C ABI. Link with -lgpufl_capture (libgpufl_capture.so). See gpufl.hpp for the C++ API. */
#ifndef GPUFL_H
#define GPUFL_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpufl_options {
    uint32_t struct_size;          /* sizeof(gpufl_options) */
    const char* app_name;          /* NULL: the program's name */
    const char* log_path;          /* directory for session directories; NULL: ./gpufl-sessions */
    int enable_synchronization;    /* record synchronizations (default 1) */
    int enable_stack_trace;        /* CPU stacks at synchronizations (default 0) */
    const char* backend_url;       /* server URL (upload) */
    const char* api_key;           /* server key (upload) */
    int mode;                      /* 0: default (everything), 1: always-on (see README) */
    const char* kernel_detail;     /* docs/kernel-detail.md: NULL off, "N" the top N
                                      kernels by GPU time, or comma-separated name fragments */
} gpufl_options;

enum { GPUFL_OK = 0, GPUFL_ALREADY_RUNNING = 1, GPUFL_DISABLED = 2, GPUFL_INTERNAL_ERROR = 3 };

/* Start recording this process. GPUFL_* environment variables override the options. */
int gpufl_init(const gpufl_options* opts);
/* Flush and close the session. Safe to call twice. */
void gpufl_shutdown(void);
/* Pause / resume recording (nothing is collected while paused; the session marks the interval).
   GPUFL_OK, or GPUFL_DISABLED when this process is not recording. */
int gpufl_pause(void);
int gpufl_resume(void);
/* Always-on mode: record everything for the next `seconds` (a full-detail window; <= 0: 10).
   GPUFL_OK, or GPUFL_DISABLED when not recording in always-on mode. */
int gpufl_capture_window(double seconds);
/* The session directory; returns its length, 0 if not recording, -(needed) if buf is too small. */
ptrdiff_t gpufl_session_dir(char* buf, size_t len);
/* Named scopes: push opens a scope on the calling thread (name copied), pop closes the thread's
   innermost one. They nest per thread; a pop with nothing open is counted and reported as a
   warning in the session, never an error. No-ops when not recording. Recorded even without a GPU. */
void gpufl_scope_push(const char* name);
void gpufl_scope_pop(void);

/* Deferred upload to a gpufl server (docs/server-api.md, "Uploading from a program"): after
   gpufl_shutdown, send the sessions under log_path, as `gpufl upload` does. Every session found
   there is sent, not only this process's: the server stores each once (one already there answers
   "unchanged"). A session still being recorded is sent up to its last closed block. Never touches
   CUDA. A field NULL or "" falls back to what gpufl_init was given (after the GPUFL_* variables
   that override it), then to GPUFL_SERVER (backend_url) and ./gpufl-sessions (log_path). */
typedef struct gpufl_upload_options {
    uint32_t struct_size;          /* sizeof(gpufl_upload_options) */
    const char* log_path;          /* directory searched for sessions (recursively) */
    const char* backend_url;       /* http(s)://host[:port] */
    const char* api_key;           /* an upload key, gfl_up_... */
} gpufl_upload_options;

/* Results of gpufl_upload_logs below 0: nothing was uploaded. */
enum {
    GPUFL_UPLOAD_NOT_CONFIGURED = -1,  /* no server or no key */
    GPUFL_UPLOAD_BAD_OPTIONS = -2,     /* the server's address is not http(s)://... */
    GPUFL_UPLOAD_NO_SESSION = -3,      /* log_path cannot be read or holds no session */
    GPUFL_UPLOAD_INTERNAL_ERROR = -4
};
/* Upload. Returns the number of sessions that failed (0: all stored; those not tried after a
   refused key or an unreachable server count as failed), or a GPUFL_UPLOAD_* code below 0. One
   line per session on stderr, prefixed "gpufl: " (only failures with GPUFL_QUIET=1). Requests are
   retried on connection errors and 5xx (5 times, backoff from 1 s). opts may be NULL. */
int gpufl_upload_logs(const gpufl_upload_options* opts);

#ifdef __cplusplus
}
#endif
#endif
