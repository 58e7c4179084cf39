//! `gpufl dump`: records as NDJSON with interned ids resolved.

use crate::summary::expand_sessions;
use anyhow::Result;
use clap::Args;
use gpufl_analysis::frames::{first_shown_frame, FrameParts};
use gpufl_trace::{Record, SessionReader, Symbols};
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Args)]
pub struct DumpArgs {
    /// Session directory.
    pub(crate) session: PathBuf,
    /// Only these record types (comma-separated, e.g. `sync,kernel`).
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = clap::builder::PossibleValuesParser::new(gpufl_trace::RECORD_TYPES)
    )]
    pub(crate) r#type: Vec<String>,
    /// Print records as stored (ids unresolved, interned records included).
    #[arg(long)]
    pub(crate) raw: bool,
    /// Stop after N records.
    #[arg(long)]
    pub(crate) limit: Option<usize>,
    /// Keep every frame of a stack: by default the leading frames of the recorder, CUPTI, the
    /// driver and the CUDA runtime's internals are left out (the first frame shown is the CUDA
    /// call the program made, e.g. `cudaStreamSynchronize`).
    #[arg(long)]
    pub(crate) all_frames: bool,
}

pub fn run(args: DumpArgs) -> Result<i32> {
    let mut out = crate::term::Stdout::new();
    let mut printed = 0usize;
    for dir in expand_sessions(std::slice::from_ref(&args.session))? {
        let (warnings, done) = dump_dir(&dir, &args, &mut printed, &mut |l| out.line(l))?;
        out.flush()?;
        if done {
            return Ok(0);
        }
        for w in warnings {
            crate::term::eprint_line(&format!("gpufl: warning: {}", crate::term::esc(&w)));
        }
    }
    out.flush()?;
    Ok(0)
}

/// Dump one session directory's records to `out`, one JSON line each: the reader's warnings, and
/// whether the limit was reached.
pub(crate) fn dump_dir(
    dir: &std::path::Path,
    args: &DumpArgs,
    printed: &mut usize,
    out: &mut dyn FnMut(&str) -> Result<()>,
) -> Result<(Vec<String>, bool)> {
    let mut reader = SessionReader::open(dir)?;
    let mut syms = Symbols::default();
    for rec in reader.by_ref() {
        let interned = syms.observe(&rec);
        if !args.r#type.is_empty() && !args.r#type.iter().any(|t| t == rec.type_name()) {
            continue;
        }
        if interned && !args.raw && args.r#type.is_empty() {
            continue;
        }
        let v = if args.raw {
            serde_json::to_value(&rec)?
        } else {
            resolve(&rec, &syms, args.all_frames)?
        };
        // JSON: serde escapes every control character, nothing more to do.
        out(&v.to_string())?;
        *printed += 1;
        if args.limit.is_some_and(|l| *printed >= l) {
            return Ok((reader.warnings(), true));
        }
    }
    Ok((reader.warnings(), false))
}

/// The record as JSON with names and stacks spelled out.
fn resolve(rec: &Record, syms: &Symbols, all_frames: bool) -> Result<Value> {
    let mut v = serde_json::to_value(rec)?;
    let stack_json = |syms: &Symbols, id| stack_json(syms, id, all_frames);
    match rec {
        Record::Kernel(k) => v["name"] = json!(syms.str(k.name)),
        Record::Function(f) => v["name"] = json!(syms.str(f.name)),
        Record::Api(a) => v["name"] = json!(syms.str(a.name)),
        Record::Scope(s) => v["name"] = json!(syms.str(s.name)),
        Record::Range(r) => v["name"] = json!(syms.str(r.name)),
        Record::Sync(s) => {
            if let Some(id) = s.stack {
                v["stack"] = stack_json(syms, id);
            }
        }
        Record::Callsite(c) => {
            v["api"] = json!(syms.str(c.api));
            v["stack"] = stack_json(syms, c.stack);
        }
        Record::Hostcall(h) => {
            v["name"] = json!(syms.str(h.name));
            if let Some(id) = h.stack {
                v["stack"] = stack_json(syms, id);
            }
        }
        Record::Hsample(h) => {
            if let Some(id) = h.call {
                v["call"] = json!(syms.str(id));
            }
            if let Some(id) = h.stack {
                v["stack"] = stack_json(syms, id);
            }
        }
        _ => {}
    }
    Ok(v)
}

/// A stack's frames, innermost first, described; from the first shown frame
/// ([`first_shown_frame`]) unless `all_frames`.
fn stack_json(syms: &Symbols, id: gpufl_trace::StackId, all_frames: bool) -> Value {
    match syms.stack(id) {
        Some(frames) => {
            let from = if all_frames {
                0
            } else {
                first_shown_frame(frames.iter().map(|&f| match syms.frame(f) {
                    Some(fr) => FrameParts::of_record(fr, syms),
                    None => FrameParts::default(),
                }))
            };
            Value::Array(
                frames[from..]
                    .iter()
                    .map(|f| json!(syms.describe_frame(*f)))
                    .collect(),
            )
        }
        None => json!(format!("<unknown stack {}>", id.0)),
    }
}
