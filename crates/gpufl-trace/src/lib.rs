//! # gpufl-trace
//!
//! The gpufl trace format (v1) alone: record types, typed ids of interned strings / frames / stacks,
//! a streaming writer (NDJSON in independent zstd blocks) and a tolerant streaming reader.
//! No CUDA; threads only to decode blocks in parallel ([`par`]). The schema is documented in `docs/trace-format.md`.

mod blocks;
pub mod closed;
pub mod error;
mod fastpath;
mod fastwrite;
pub mod feed;
pub mod function;
pub mod ids;
pub mod kdetail;
pub mod limits;
pub mod par;
pub mod reader;
pub mod records;
mod ring;
pub mod run;
pub mod session;
pub mod signals;
pub mod symbols;
pub mod telemetry;
pub mod userpaths;
pub mod writer;

pub use closed::{closed_len, open_closed, ClosedFile};
pub use error::TraceError;
pub use function::{Function, FunctionSource};
pub use ids::{FrameId, StackId, StrId};
pub use kdetail::{Kdetail, KdetailLine, Kstall, KstallLine, SassCounts};
pub use limits::ReadLimits;
pub use par::{
    default_threads, BlockFold, BlockFolding, Item, Items, ParSessionReader, ParTraceReader,
    SharedBytes,
};
pub use reader::{SessionReader, TraceReader};
pub use records::*;
pub use symbols::Symbols;
pub use telemetry::{throttle, Telemetry};
pub use writer::{FrameData, TraceWriter};
