// gpufl C++ API, as in the sync-attribution seed:
//
//   gpufl::InitOptions opts;
//   opts.app_name = "my_app";
//   opts.enable_synchronization = true;   // capture cudaStream/Device/EventSynchronize
//   opts.enable_stack_trace = true;       // capture CPU stacks at sync points
//   opts.api_key = std::getenv("GPUFL_API_KEY");   // NULL is fine
//   gpufl::init(opts);
//   ... workload ...
//   gpufl::shutdown();
//
//   // Deferred upload — runs post-shutdown, never during the workload.
//   gpufl::UploadOptions uopts;
//   uopts.log_path = opts.log_path;
//   uopts.backend_url = opts.backend_url;   // unset: InitOptions' value, else GPUFL_SERVER
//   uopts.api_key = opts.api_key;
//   gpufl::uploadLogs(uopts);
//
// Link with -lgpufl_capture. Build with -g so stacks resolve to file:line.
#pragma once
#include <string>
#include "gpufl.h"

namespace gpufl {

// A string option that accepts NULL (std::getenv's result when a variable is unset).
class OptionString {
public:
    OptionString() = default;
    OptionString(const char* s) { *this = s; }
    OptionString(std::string s) : value_(std::move(s)), set_(true) {}
    OptionString& operator=(const char* s) {
        set_ = s != nullptr;
        value_ = s ? s : "";
        return *this;
    }
    OptionString& operator=(const std::string& s) {
        set_ = true;
        value_ = s;
        return *this;
    }
    bool empty() const { return value_.empty(); }
    const std::string& str() const { return value_; }
    const char* c_str_or_null() const { return set_ && !value_.empty() ? value_.c_str() : nullptr; }
    operator const std::string&() const { return value_; }

private:
    std::string value_;
    bool set_ = false;
};

struct InitOptions {
    OptionString app_name;
    OptionString log_path;
    bool enable_synchronization = true;
    bool enable_stack_trace = false;  // off by default in the API; `gpufl record` turns it on
    OptionString backend_url;
    OptionString api_key;
    // Always-on: syncs with stacks, sampled call sites, telemetry all the time; GPU activity in
    // windows set by a cost budget; disk bounded (README, "Always-on recording").
    bool always_on = false;
    // Inside kernels (docs/kernel-detail.md): "N" the top N kernels by GPU time, or
    // comma-separated name fragments; unset: off.
    OptionString kernel_detail;
};

enum class InitResult { Ok = GPUFL_OK, AlreadyRunning = GPUFL_ALREADY_RUNNING, Disabled = GPUFL_DISABLED, InternalError = GPUFL_INTERNAL_ERROR };

// Start recording. Never throws; when capture cannot run, one line on stderr says why and the
// program goes on unchanged.
inline InitResult init(const InitOptions& o) {
    gpufl_options c{};
    c.struct_size = sizeof(c);
    c.app_name = o.app_name.c_str_or_null();
    c.log_path = o.log_path.c_str_or_null();
    c.enable_synchronization = o.enable_synchronization ? 1 : 0;
    c.enable_stack_trace = o.enable_stack_trace ? 1 : 0;
    c.backend_url = o.backend_url.c_str_or_null();
    c.api_key = o.api_key.c_str_or_null();
    c.mode = o.always_on ? 1 : 0;
    c.kernel_detail = o.kernel_detail.c_str_or_null();
    return static_cast<InitResult>(gpufl_init(&c));
}

// Flush and close the session (also done automatically at process exit).
inline void shutdown() { gpufl_shutdown(); }

// Pause / resume recording, e.g. to record only some steps: nothing is collected while paused.
// Return false when this process is not recording.
inline bool pause() { return gpufl_pause() == GPUFL_OK; }
inline bool resume() { return gpufl_resume() == GPUFL_OK; }

// Always-on mode: record everything for the next `seconds` (a full-detail window). False when
// this process is not recording in always-on mode.
inline bool capture_window(double seconds = 10.0) { return gpufl_capture_window(seconds) == GPUFL_OK; }

// The session directory ("" when not recording).
inline std::string session_dir() {
    char buf[4096];
    ptrdiff_t n = gpufl_session_dir(buf, sizeof(buf));
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Deferred upload to a gpufl server (docs/server-api.md): unset fields fall back to what init was
// given (after the GPUFL_* variables), then GPUFL_SERVER and ./gpufl-sessions.
struct UploadOptions {
    OptionString log_path;     // directory searched for sessions
    OptionString backend_url;  // http(s)://host[:port]
    OptionString api_key;      // an upload key, gfl_up_...
};

// What uploadLogs did: `code` is gpufl_upload_logs' result (sessions failed, or a
// GPUFL_UPLOAD_* code below 0 when nothing was uploaded).
struct UploadResult {
    int code = 0;
    bool ok() const { return code == 0; }                   // every session stored
    int failed() const { return code > 0 ? code : 0; }       // sessions that failed
    bool not_configured() const { return code == GPUFL_UPLOAD_NOT_CONFIGURED; }
    explicit operator bool() const { return ok(); }
};

// Upload every session under log_path (not only this process's: the server stores each once;
// one still being recorded goes up to its last closed block). Never throws, never touches CUDA;
// one line per session on stderr.
inline UploadResult uploadLogs(const UploadOptions& o) {
    gpufl_upload_options c{};
    c.struct_size = sizeof(c);
    c.log_path = o.log_path.c_str_or_null();
    c.backend_url = o.backend_url.c_str_or_null();
    c.api_key = o.api_key.c_str_or_null();
    UploadResult r;
    r.code = gpufl_upload_logs(&c);
    return r;
}
inline UploadResult upload_logs(const UploadOptions& o) { return uploadLogs(o); }

// A named scope for the lifetime of the object (RAII): the report rolls up wall time, GPU busy
// time, kernels and synchronizations per scope, and names the innermost scope of each insight.
//
//   { gpufl::Scope s("forward_pass"); model.forward(); }
//   void step() { GFL_SCOPE("step"); ... }
class Scope {
public:
    explicit Scope(const char* name) { gpufl_scope_push(name); }
    explicit Scope(const std::string& name) { gpufl_scope_push(name.c_str()); }
    ~Scope() { gpufl_scope_pop(); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
};

}  // namespace gpufl

#define GFL_SCOPE_CAT2_(a, b) a##b
#define GFL_SCOPE_CAT_(a, b) GFL_SCOPE_CAT2_(a, b)
// Open a scope until the end of the enclosing block.
#define GFL_SCOPE(name) ::gpufl::Scope GFL_SCOPE_CAT_(gfl_scope_, __LINE__)(name)
