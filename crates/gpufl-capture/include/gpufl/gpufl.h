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

#ifdef __cplusplus
}
#endif
#endif
