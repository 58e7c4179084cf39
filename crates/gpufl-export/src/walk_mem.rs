//! Allocations and frees (`mem` records) in the export: per GPU, a counter of the bytes the
//! process holds allocated (each allocation and free moves it; a free of an address never seen
//! allocated is ignored, as in gpufl-analysis's replay) and an instant per operation on the
//! GPU's "allocations" track — `alloc 256.0 MiB @ train.py:12`, `free 256.0 MiB (allocated @
//! train.py:12)`, `allocation failed (out of memory): 256.0 MiB @ train.py:28` — with the bytes,
//! address, kind, API, stream and stack as arguments. State: the allocations live (address,
//! bytes, line).

use super::{spelling, Walker};
use crate::sink::{Arg, Cat, Event, Metric, Track};
use crate::ExportError;
use gpufl_analysis::fmt_bytes;
use gpufl_trace::MemOp;
use std::collections::HashMap;

/// The allocations live during the walk.
#[derive(Default)]
pub(super) struct LiveMem {
    /// (device, address) → (bytes, allocating line).
    live: HashMap<(u32, u64), (u64, Option<String>)>,
    /// Live bytes per device.
    dev: HashMap<u32, u64>,
}

impl Walker<'_> {
    /// One `mem` record: the device's counter when the live bytes change, and its instant.
    pub(super) fn mem(&mut self, m: &gpufl_trace::Mem) -> Result<(), ExportError> {
        // Written again at a rolling file's start: shown once (the original, if its file is
        // still there).
        if m.carried && self.mem.live.contains_key(&(m.dev, m.addr)) {
            return Ok(());
        }
        let ts = if m.carried {
            self.clock.unix(m.ts).max(self.file_start)
        } else {
            self.clock.unix(m.ts)
        };
        let line = m.stack.and_then(|id| self.top_line(id));
        let at = line
            .as_deref()
            .map(|l| format!(" @ {l}"))
            .unwrap_or_default();
        let name = match m.op {
            MemOp::Alloc => {
                let old = self
                    .mem
                    .live
                    .insert((m.dev, m.addr), (m.bytes, line.clone()));
                let d = self.mem.dev.entry(m.dev).or_default();
                *d = d.saturating_sub(old.map_or(0, |o| o.0)) + m.bytes;
                let v = *d as f64;
                self.stats.counters += 1;
                self.sink
                    .counter(self.sess, m.dev, Metric::MemLive, ts, v)?;
                format!("alloc {}{at}", fmt_bytes(m.bytes))
            }
            MemOp::Free => match self.mem.live.remove(&(m.dev, m.addr)) {
                Some((bytes, from)) => {
                    let d = self.mem.dev.entry(m.dev).or_default();
                    *d = d.saturating_sub(bytes);
                    let v = *d as f64;
                    self.stats.counters += 1;
                    self.sink
                        .counter(self.sess, m.dev, Metric::MemLive, ts, v)?;
                    match from {
                        Some(l) => format!("free {} (allocated @ {l})", fmt_bytes(bytes)),
                        None => format!("free {}", fmt_bytes(bytes)),
                    }
                }
                None => format!("free{at}"),
            },
            MemOp::AllocFailed => {
                format!(
                    "allocation failed (out of memory): {}{at}",
                    fmt_bytes(m.bytes)
                )
            }
            MemOp::Unknown => return Ok(()),
        };
        let kind = spelling(&m.mem_kind);
        let api = m.api.map(|a| self.sym.str(a).to_string());
        let stack = m.stack.map(|id| self.stack(id)).unwrap_or_default();
        let mut args = vec![
            ("bytes", Arg::U(m.bytes)),
            ("addr", Arg::U(m.addr)),
            ("kind", Arg::S(&kind)),
            ("corr", Arg::U(m.corr as u64)),
        ];
        if let Some(a) = &api {
            args.push(("api", Arg::S(a)));
        }
        if let Some(s) = m.stream {
            args.push(("stream", Arg::U(s as u64)));
        }
        if let Some(f) = m.free {
            args.push(("device_free", Arg::U(f)));
        }
        if let Some(tid) = m.tid {
            args.push(("tid", Arg::U(tid)));
        }
        if m.stack.is_some() {
            args.push(("stack", Arg::List(&stack)));
        }
        self.emit(&Event {
            track: Track::Memory(m.dev),
            ts,
            dur: None,
            name: &name,
            cat: Cat::Mem,
            args: &args,
            flow_out: None,
            flow_in: None,
        })
    }
}
