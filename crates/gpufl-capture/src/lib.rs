//! # gpufl-capture
//!
//! The in-process recorder, loaded into a CUDA program either through CUDA's injection mechanism
//! (`CUDA_INJECTION64_PATH`, used by `gpufl record`) or by calling `gpufl::init` (C ABI in
//! [`ffi`]). CUPTI delivers activity records into buffers drained by a background writer thread;
//! API-entry callbacks at every synchronization capture the CPU stack (native + Python) as raw
//! addresses, symbolized later off the hot path. See `docs/architecture.md`.

pub mod activity;
pub mod always_on;
pub mod callcost;
pub mod callmark;
pub mod cbids;
pub mod clock;
pub mod collection;
pub mod crash;
pub mod cubin;
pub mod cubin_lines;
pub mod cupti;
pub mod detach;
pub mod device;
pub mod dl;
pub mod driver;
pub mod ffi;
pub mod graphnodes;
pub mod hostcalls;
pub mod hostsampler;
pub mod inductor;
pub mod kernel_detail;
pub mod kernel_stall;
pub mod memcalls;
pub mod metrics_feed;
pub mod modules;
pub mod nvtx;
pub mod options;
pub mod pool;
pub mod procinfo;
pub mod pyframes;
pub mod recorder;
pub mod rolling;
pub mod scopes;
pub mod sink;
pub mod sites;
pub mod srctext;
pub mod stack;
pub mod symbolize;
pub mod telemetry;
pub mod unwind;
pub mod upload;
