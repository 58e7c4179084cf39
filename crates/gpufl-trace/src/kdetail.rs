//! The records from inside kernels (issue 19): `kdetail`, instruction-level counters of one kernel
//! function over a collection window (CUPTI's SASS metrics), and `kstall`, the stall reasons PC
//! sampling found there. Both are rare (one per kernel function and window) and parsed by serde;
//! their arrays and maps are bounded ([`MAX_RECORD_LINES`], [`MAX_STALL_REASONS`]): a record
//! beyond the bounds is skipped by the reader with a warning, never held. Schema:
//! `docs/trace-format.md` (`kdetail`, `kstall`).

use crate::ids::StrId;
use serde::de::{Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::marker::PhantomData;

/// Entries of a record's `lines` array read at most: a longer array makes the record invalid
/// (skipped with a warning). A kernel has a few hundred lines; 100,000 is far beyond any.
pub const MAX_RECORD_LINES: usize = 100_000;

/// Stall reasons of one line read at most (CUPTI has about 40): more makes the record invalid.
pub const MAX_STALL_REASONS: usize = 256;

/// Start of the message of a bound's error, which the reader recognizes to say why it skipped
/// the record.
pub(crate) const BOUND_ERROR: &str = "beyond the reader's bounds";

/// Instruction-level counters: sums over the instrumented launches. Every key is optional (a
/// recorder writes those it has; in `lines`, those that are not zero); unknown keys are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct SassCounts {
    /// Warp-level SASS instructions executed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inst: Option<u64>,
    /// Thread-level instructions executed (active, predicated-on lanes summed): active lanes per
    /// warp instruction = `thread_inst / inst`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_inst: Option<u64>,
    /// Branch executions where all active threads took the same target, and where they took
    /// two or more (branch efficiency = uniform / (uniform + divergent)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch_uniform: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch_divergent: Option<u64>,
    /// Warp-level global load instructions executed (requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gld_inst: Option<u64>,
    /// 32-byte sectors those loads touched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gld_sectors: Option<u64>,
    /// Sectors a fully coalesced access of the same bytes would touch (when the recorder has it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gld_sectors_ideal: Option<u64>,
    /// The same three for global stores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gst_inst: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gst_sectors: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gst_sectors_ideal: Option<u64>,
    /// Warp-level shared-memory load and store instructions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_inst: Option<u64>,
    /// Wavefronts they took, and the wavefronts without bank conflicts (conflicts = the
    /// difference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_wavefronts: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_wavefronts_ideal: Option<u64>,
}

/// The counters of one source line of the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct KdetailLine {
    pub file: StrId,
    pub line: u32,
    #[serde(default)]
    pub m: SassCounts,
}

/// Instruction-level counters of one kernel function over a window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Kdetail {
    /// Kernel function name: the same string id as the kernel records' `name`.
    pub name: StrId,
    pub dev: u32,
    /// The window the counts come from, trace clock (ns).
    pub start: u64,
    pub end: u64,
    /// Launches of the function instrumented in the window.
    #[serde(default)]
    pub launches: u64,
    /// false: the cubin had no line table (built without `-lineinfo`): `lines` is empty.
    #[serde(default = "yes")]
    pub lineinfo: bool,
    #[serde(default)]
    pub totals: SassCounts,
    /// Per source line, those with counts; at most [`MAX_RECORD_LINES`].
    #[serde(default, deserialize_with = "bounded_vec")]
    pub lines: Vec<KdetailLine>,
    /// Counts of the PCs no line was found for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmapped: Option<SassCounts>,
}

/// The PC samples of one source line and their stall reasons.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct KstallLine {
    pub file: StrId,
    pub line: u32,
    /// Samples at the line's PCs.
    #[serde(default)]
    pub samples: u64,
    /// Samples by stall reason: CUPTI's name less its `smsp__pcsamp_warps_issue_stalled_` prefix,
    /// lowercase (`long_scoreboard`, `barrier`, …); at most [`MAX_STALL_REASONS`].
    #[serde(default, deserialize_with = "bounded_map")]
    pub stalls: BTreeMap<String, u64>,
}

/// PC sampling's stall reasons of one kernel function over a window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Kstall {
    pub name: StrId,
    pub dev: u32,
    pub start: u64,
    pub end: u64,
    #[serde(default)]
    pub launches: u64,
    /// Sampling period, log2 of cycles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_log2: Option<u32>,
    /// Per source line; at most [`MAX_RECORD_LINES`].
    #[serde(default, deserialize_with = "bounded_vec")]
    pub lines: Vec<KstallLine>,
    /// Samples with no line.
    #[serde(default)]
    pub unmapped: u64,
    /// Those samples by stall reason (names as in [`KstallLine::stalls`]; at most
    /// [`MAX_STALL_REASONS`]): a kernel built without line info still says where its warps wait.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "bounded_map"
    )]
    pub unmapped_stalls: BTreeMap<String, u64>,
    /// Every sample of the window.
    #[serde(default)]
    pub total: u64,
}

fn yes() -> bool {
    true
}

/// A sequence of at most [`MAX_RECORD_LINES`] elements; more is an error.
fn bounded_vec<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct V<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "an array of at most {MAX_RECORD_LINES} lines")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(256));
            while let Some(x) = seq.next_element()? {
                if v.len() >= MAX_RECORD_LINES {
                    return Err(A::Error::custom(format!(
                        "{BOUND_ERROR}: more than {MAX_RECORD_LINES} lines"
                    )));
                }
                v.push(x);
            }
            Ok(v)
        }
    }
    d.deserialize_seq(V(PhantomData))
}

/// A map of at most [`MAX_STALL_REASONS`] entries (a key repeated: the last value); more is an
/// error.
fn bounded_map<'de, D>(d: D) -> Result<BTreeMap<String, u64>, D::Error>
where
    D: Deserializer<'de>,
{
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = BTreeMap<String, u64>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "an object of at most {MAX_STALL_REASONS} stall reasons")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut m = BTreeMap::new();
            while let Some((k, v)) = map.next_entry::<String, u64>()? {
                m.insert(k, v);
                if m.len() > MAX_STALL_REASONS {
                    return Err(A::Error::custom(format!(
                        "{BOUND_ERROR}: more than {MAX_STALL_REASONS} stall reasons on a line"
                    )));
                }
            }
            Ok(m)
        }
    }
    d.deserialize_map(V)
}
