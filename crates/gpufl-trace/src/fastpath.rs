//! A hand-written parser for the exact shape [`crate::TraceWriter`] gives the records a trace holds
//! by the million — `kernel`, `api`, `sync`, `memcpy` and `memset` lines (keys in schema order, no
//! whitespace, integers and the enums' own names only): several times faster than serde_json.
//! Anything else — another key order, an extra, repeated or missing key, whitespace, an escape in
//! a string, an enum name serde_json would read as "other", a number serde_json would read
//! differently or refuse (leading zeros, `-0`, `+`, fractions, exponents, overflow) — returns None,
//! and the caller parses the line with serde_json, so whatever this accepts is parsed exactly as
//! serde_json would parse it.

use crate::ids::{StackId, StrId};
use crate::records::{
    Api, ApiDomain, CopyKind, GraphNode, Kernel, Memcpy, MemoryKind, Memset, Record, Sync, SyncKind,
};

struct Cur<'a> {
    b: &'a [u8],
    i: usize,
}

/// The value of eight decimal digits held one per byte (0..=9, the first digit in the lowest
/// byte), with three multiplications instead of eight dependent ones.
#[inline(always)]
fn eight_digits(d: u64) -> u64 {
    let d = (d.wrapping_mul(10 << 8 | 1) >> 8) & 0x00FF_00FF_00FF_00FF;
    let d = (d.wrapping_mul(100 << 16 | 1) >> 16) & 0x0000_FFFF_0000_FFFF;
    d.wrapping_mul(10_000 << 32 | 1) >> 32
}

impl Cur<'_> {
    /// Step over the literal `s` (compared as one fixed-size block).
    #[inline(always)]
    fn lit<const N: usize>(&mut self, s: &[u8; N]) -> Option<()> {
        let at = self.b.get(self.i..self.i + N)?;
        if at == s {
            self.i += N;
            Some(())
        } else {
            None
        }
    }

    /// Whether the literal `s` comes next (stepped over if so).
    #[inline(always)]
    fn opt_lit<const N: usize>(&mut self, s: &[u8; N]) -> bool {
        self.lit(s).is_some()
    }

    /// An unsigned JSON integer: `0` or `[1-9][0-9]*`, at most `max`. One of fewer than eight
    /// digits with eight bytes left is counted digit by digit (branches the CPU predicts: a field
    /// keeps its width from line to line) and converted at once from the eight bytes, so neither
    /// the value nor the position waits on a chain of multiplications.
    #[inline(always)]
    fn unsigned(&mut self, max: u64) -> Option<u64> {
        let start = self.i;
        if let Some(chunk) = self.b.get(start..start + 8) {
            let chunk: &[u8; 8] = chunk.try_into().ok()?;
            let mut n = 0;
            while n < 8 && chunk[n].wrapping_sub(b'0') <= 9 {
                n += 1;
            }
            let t = u64::from_le_bytes(*chunk).wrapping_sub(0x3030_3030_3030_3030);
            if n < 8 {
                if n == 0 || (n > 1 && chunk[0] == b'0') {
                    return None;
                }
                let v = eight_digits(t << (64 - 8 * n));
                if v > max {
                    return None;
                }
                self.i = start + n;
                return Some(v);
            }
            // Eight digits or more (correlation ids past 10 M): the first eight at once, the rest
            // (and the checks) as they come.
            self.i = start + 8;
            return self.unsigned_from(start, eight_digits(t), max);
        }
        self.unsigned_from(start, 0, max)
    }

    /// [`Cur::unsigned`] where the digits from `start` to the cursor are already read, to `v`.
    #[inline(always)]
    fn unsigned_from(&mut self, start: usize, mut v: u64, max: u64) -> Option<u64> {
        let b = self.b;
        let mut i = self.i;
        // 19 digits cannot overflow a u64; further ones are checked.
        let fast_end = b.len().min(start + 19);
        while i < fast_end {
            let d = b[i].wrapping_sub(b'0');
            if d > 9 {
                break;
            }
            v = v * 10 + u64::from(d);
            i += 1;
        }
        while let Some(&c) = b.get(i) {
            let d = c.wrapping_sub(b'0');
            if d > 9 {
                break;
            }
            v = v.checked_mul(10)?.checked_add(u64::from(d))?;
            i += 1;
        }
        if i == start || (i - start > 1 && b[start] == b'0') || v > max {
            return None;
        }
        self.i = i;
        Some(v)
    }

    /// A `u64` that nearly always has 16 digits or more (a timestamp): its first 16 digits
    /// converted eight at a time, with three multiplications per eight instead of eight dependent
    /// ones; the rest as [`Cur::unsigned`] reads them.
    #[inline(always)]
    fn u64_long(&mut self) -> Option<u64> {
        let start = self.i;
        if let Some(chunk) = self.b.get(start..start + 16) {
            let lo = u64::from_le_bytes(chunk[..8].try_into().ok()?);
            let hi = u64::from_le_bytes(chunk[8..].try_into().ok()?);
            // Per byte: its digit value, and the high bit set where it is not a digit.
            let (a, b) = (
                lo.wrapping_sub(0x3030_3030_3030_3030),
                hi.wrapping_sub(0x3030_3030_3030_3030),
            );
            let non = (a
                | a.wrapping_add(0x7676_7676_7676_7676)
                | b
                | b.wrapping_add(0x7676_7676_7676_7676))
                & 0x8080_8080_8080_8080;
            if non == 0 && chunk[0] != b'0' {
                let v = eight_digits(a) * 100_000_000 + eight_digits(b);
                // Nineteen digits (every timestamp from 2001 to 2286): the last three at once
                // when a non-digit follows them (19 digits cannot overflow a u64).
                if let Some(&[x, y, z, after]) = self.b.get(start + 16..start + 20) {
                    let (x, y, z) = (
                        x.wrapping_sub(b'0'),
                        y.wrapping_sub(b'0'),
                        z.wrapping_sub(b'0'),
                    );
                    if x <= 9 && y <= 9 && z <= 9 && after.wrapping_sub(b'0') > 9 {
                        self.i = start + 19;
                        return Some(
                            v * 1000 + u64::from(x) * 100 + u64::from(y) * 10 + u64::from(z),
                        );
                    }
                }
                self.i = start + 16;
                return self.unsigned_from(start, v, u64::MAX);
            }
        }
        self.unsigned(u64::MAX)
    }

    #[inline(always)]
    fn u64(&mut self) -> Option<u64> {
        self.unsigned(u64::MAX)
    }

    #[inline(always)]
    fn u32(&mut self) -> Option<u32> {
        self.unsigned(u32::MAX as u64).map(|v| v as u32)
    }

    #[inline(always)]
    fn i32(&mut self) -> Option<i32> {
        if self.b.get(self.i) == Some(&b'-') {
            self.i += 1;
            let v = self.unsigned(1 << 31)?;
            // "-0" is left to serde_json.
            (v != 0).then(|| (-(v as i64)) as i32)
        } else {
            self.unsigned(i32::MAX as u64).map(|v| v as i32)
        }
    }

    #[inline(always)]
    fn dims(&mut self) -> Option<[i32; 3]> {
        self.lit(b"[")?;
        let x = self.i32()?;
        self.lit(b",")?;
        let y = self.i32()?;
        self.lit(b",")?;
        let z = self.i32()?;
        self.lit(b"]")?;
        Some([x, y, z])
    }

    /// A string of plain bytes up to its closing quote (the opening one already passed): what one
    /// of `names` it is. Anything else (an escape, another name) is left to serde_json.
    #[inline(always)]
    fn name<T: Copy>(&mut self, names: &[(&[u8], T)]) -> Option<T> {
        let rest = self.b.get(self.i..)?;
        let len = memchr::memchr(b'"', rest)?;
        let s = &rest[..len];
        let v = names.iter().find(|(n, _)| *n == s)?.1;
        self.i += len + 1;
        Some(v)
    }

    /// An optional `,"graph":[g,n]` (written last when present): None when it is damaged,
    /// Some(None) when absent.
    #[inline]
    fn graph(&mut self) -> Option<Option<GraphNode>> {
        if !self.opt_lit(b",\"graph\":[") {
            return Some(None);
        }
        let g = self.u32()?;
        self.lit(b",")?;
        let n = self.u64()?;
        self.lit(b"]")?;
        Some(Some(GraphNode(g, n)))
    }

    /// The end of the line: `}` and nothing after it.
    #[inline(always)]
    fn close(&mut self) -> Option<()> {
        self.lit(b"}")?;
        (self.i == self.b.len()).then_some(())
    }
}

const COPY_KINDS: [(&[u8], CopyKind); 11] = [
    (b"HtoD", CopyKind::HtoD),
    (b"DtoH", CopyKind::DtoH),
    (b"DtoD", CopyKind::DtoD),
    (b"HtoH", CopyKind::HtoH),
    (b"PtoP", CopyKind::PtoP),
    (b"HtoA", CopyKind::HtoA),
    (b"AtoH", CopyKind::AtoH),
    (b"AtoA", CopyKind::AtoA),
    (b"AtoD", CopyKind::AtoD),
    (b"DtoA", CopyKind::DtoA),
    (b"Unknown", CopyKind::Unknown),
];

const MEMORY_KINDS: [(&[u8], MemoryKind); 8] = [
    (b"device", MemoryKind::Device),
    (b"pinned", MemoryKind::Pinned),
    (b"pageable", MemoryKind::Pageable),
    (b"managed", MemoryKind::Managed),
    (b"array", MemoryKind::Array),
    (b"device_static", MemoryKind::DeviceStatic),
    (b"managed_static", MemoryKind::ManagedStatic),
    (b"unknown", MemoryKind::Unknown),
];

const SYNC_KINDS: [(&[u8], SyncKind); 5] = [
    (b"stream_synchronize", SyncKind::StreamSynchronize),
    (b"event_synchronize", SyncKind::EventSynchronize),
    (b"context_synchronize", SyncKind::ContextSynchronize),
    (b"stream_wait_event", SyncKind::StreamWaitEvent),
    (b"unknown", SyncKind::Unknown),
];

const API_DOMAINS: [(&[u8], ApiDomain); 3] = [
    (b"runtime", ApiDomain::Runtime),
    (b"driver", ApiDomain::Driver),
    (b"unknown", ApiDomain::Unknown),
];

/// Parse a line (without its newline) of one of the writer's exact shapes above; None otherwise
/// (another record type, or anything unusual: serde_json's to parse). No cache: see [`Parser`].
#[cfg(test)]
pub(crate) fn record(line: &[u8]) -> Option<Record> {
    record_with(line, None)
}

#[inline(always)]
fn record_with(line: &[u8], tails: Option<&mut Tails>) -> Option<Record> {
    let mut c = Cur { b: line, i: 0 };
    c.lit(b"{\"t\":\"")?;
    match line.get(c.i)? {
        b'k' => kernel_body(&mut c, tails).map(Record::Kernel),
        b'a' => api_body(&mut c).map(Record::Api),
        b's' => sync_body(&mut c).map(Record::Sync),
        b'm' => {
            if c.opt_lit(b"memcpy\",\"kind\":\"") {
                memcpy_body(&mut c).map(Record::Memcpy)
            } else {
                memset_body(&mut c).map(Record::Memset)
            }
        }
        _ => None,
    }
}

/// The fast path with a cache of `kernel` lines' launch configurations (one per thread that
/// parses: no lock). A launch's line ends with its configuration — from `,"grid":` to
/// `local_mem` or `smem_executed`, ~120 of its ~245 bytes, 11 of its 18 numbers — which repeats
/// from one launch of a kernel to the next: the parsed fields of each such tail seen lately are
/// kept with its bytes, and a line whose tail has the same bytes takes them instead of parsing
/// them again. Records are those the line's parse without the cache gives (see [`cached_config`]
/// for why, and the tests).
pub(crate) struct Parser {
    tails: Box<Tails>,
}

impl Parser {
    pub(crate) fn new() -> Parser {
        Parser {
            tails: Box::new(Tails {
                sets: [[Tail::EMPTY; WAYS]; SETS],
                #[cfg(test)]
                hits: 0,
            }),
        }
    }

    /// Parse a line (without its newline) of one of the writer's exact shapes, as the fast path
    /// without the cache does; None otherwise (serde_json's to parse).
    #[inline]
    pub(crate) fn record(&mut self, line: &[u8]) -> Option<Record> {
        record_with(line, Some(&mut self.tails))
    }
}

impl Default for Parser {
    fn default() -> Self {
        Parser::new()
    }
}

/// Sets of the tail cache (a power of two), of [`WAYS`] entries each.
const SETS: usize = 128;
const WAYS: usize = 2;
/// The longest tail kept (the writer's run to ~190 bytes only with numbers near their limits).
const TAIL_MAX: usize = 144;

/// A kernel line's launch configuration: the fields from `grid` to `smem_executed`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Config {
    grid: [i32; 3],
    block: [i32; 3],
    regs: u16,
    smem_static: i32,
    smem_dynamic: i32,
    local_mem: u32,
    smem_executed: Option<u32>,
}

#[derive(Clone, Copy)]
struct Tail {
    /// The tail's length in bytes; 0: an empty entry (a tail has at least 16).
    len: usize,
    key: [u8; TAIL_MAX],
    config: Config,
}

impl Tail {
    const EMPTY: Tail = Tail {
        len: 0,
        key: [0; TAIL_MAX],
        config: Config {
            grid: [0; 3],
            block: [0; 3],
            regs: 0,
            smem_static: 0,
            smem_dynamic: 0,
            local_mem: 0,
            smem_executed: None,
        },
    };
}

struct Tails {
    /// Per set, the entry made last first.
    sets: [[Tail; WAYS]; SETS],
    /// Lines whose configuration came from the cache.
    #[cfg(test)]
    hits: u64,
}

/// Eight bytes of `b` from `at` (which the caller keeps within it).
#[inline(always)]
fn word(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|w| w.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Where a kernel line's tail that starts at `start` ends: before its closing `}`, or before a
/// `,"graph":[` that ends the line (its node ids differ from launch to launch) — so the byte at
/// the end is `}` or `,`. None for any other end (the line is parsed without the cache).
#[inline(always)]
fn tail_end(b: &[u8], start: usize) -> Option<usize> {
    let n = b.len();
    if n < start + 2 || b[n - 1] != b'}' {
        return None;
    }
    if b[n - 2] != b']' {
        return Some(n - 1);
    }
    let open = start + memchr::memrchr(b'[', &b[start..n - 1])?;
    let at = open.checked_sub(9)?;
    (at >= start && b[at..=open] == *b",\"graph\":[").then_some(at)
}

/// The set of the cache a tail (of 16 bytes or more) belongs in: a hash of its length and of the
/// bytes where tails differ most (the grid, the middle, the last fields). Entries are told apart
/// by their bytes; a collision costs only a parse.
#[inline(always)]
fn set_of(key: &[u8]) -> usize {
    let len = key.len();
    let h = word(key, 8)
        ^ word(key, len / 2 - 4).rotate_left(21)
        ^ word(key, len - 8).rotate_left(42)
        ^ len as u64;
    (h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SETS.trailing_zeros())) as usize % SETS
}

/// The configuration of a kernel line (`c` at its `,"grid":`), from the cache when a tail of the
/// same bytes was parsed before, parsed (and kept) otherwise.
///
/// Why the fields are those [`parse_config`] would give: an entry is made only when parsing its
/// tail stopped exactly at the tail's end, and every tail is followed by `}` or `,` (see
/// [`tail_end`]). Parsing reads the tail's bytes and, past its end, only what ends its last
/// number (any non-digit ends it alike) and the bytes compared with `,"smem_executed":` when the
/// tail stops after `local_mem` (which neither `}` nor `,"` matches). So a tail of the same bytes,
/// also followed by `}` or `,`, parses to the same fields and stops at its end: the cached ones.
#[inline(always)]
fn cached_config(c: &mut Cur, tails: &mut Tails) -> Option<Config> {
    let start = c.i;
    let Some(end) = tail_end(c.b, start) else {
        return parse_config(c);
    };
    let key = &c.b[start..end];
    let len = key.len();
    if !(16..=TAIL_MAX).contains(&len) {
        return parse_config(c);
    }
    let set = &mut tails.sets[set_of(key)];
    for t in set.iter() {
        if t.len == len && t.key[..len] == *key {
            c.i = end;
            #[cfg(test)]
            {
                tails.hits += 1;
            }
            return Some(t.config);
        }
    }
    let config = parse_config(c)?;
    if c.i == end {
        set.copy_within(0..WAYS - 1, 1);
        let t = &mut set[0];
        t.len = len;
        t.key[..len].copy_from_slice(key);
        t.config = config;
    }
    Some(config)
}

/// The configuration of a kernel line, parsed (`c` at its `,"grid":`).
#[inline(always)]
fn parse_config(c: &mut Cur) -> Option<Config> {
    c.lit(b",\"grid\":")?;
    let grid = c.dims()?;
    c.lit(b",\"block\":")?;
    let block = c.dims()?;
    c.lit(b",\"regs\":")?;
    let regs = c.unsigned(u16::MAX as u64)? as u16;
    c.lit(b",\"smem_static\":")?;
    let smem_static = c.i32()?;
    c.lit(b",\"smem_dynamic\":")?;
    let smem_dynamic = c.i32()?;
    c.lit(b",\"local_mem\":")?;
    let local_mem = c.u32()?;
    // Optional, written last when present (recorders since the device-limits change).
    let smem_executed = if c.opt_lit(b",\"smem_executed\":") {
        Some(c.u32()?)
    } else {
        None
    };
    Some(Config {
        grid,
        block,
        regs,
        smem_static,
        smem_dynamic,
        local_mem,
        smem_executed,
    })
}

/// Parse a `kernel` line (without its newline) of the writer's exact shape; None otherwise.
#[cfg(test)]
pub(crate) fn kernel(line: &[u8]) -> Option<Kernel> {
    match record(line)? {
        Record::Kernel(k) => Some(k),
        _ => None,
    }
}

#[inline(always)]
fn kernel_body(c: &mut Cur, tails: Option<&mut Tails>) -> Option<Kernel> {
    c.lit(b"kernel\",\"name\":")?;
    let name = StrId(c.u32()?);
    c.lit(b",\"start\":")?;
    let start = c.u64_long()?;
    c.lit(b",\"end\":")?;
    let end = c.u64_long()?;
    c.lit(b",\"dev\":")?;
    let dev = c.u32()?;
    c.lit(b",\"ctx\":")?;
    let ctx = c.u32()?;
    c.lit(b",\"stream\":")?;
    let stream = c.u32()?;
    c.lit(b",\"corr\":")?;
    let corr = c.u32()?;
    let Config {
        grid,
        block,
        regs,
        smem_static,
        smem_dynamic,
        local_mem,
        smem_executed,
    } = match tails {
        Some(tails) => cached_config(c, tails)?,
        None => parse_config(c)?,
    };
    // Most lines end here (what `graph` and `close` would find, at once).
    let graph = if c.i + 1 == c.b.len() && c.b[c.i] == b'}' {
        None
    } else {
        let graph = c.graph()?;
        c.close()?;
        graph
    };
    Some(Kernel {
        name,
        start,
        end,
        dev,
        ctx,
        stream,
        corr,
        grid,
        block,
        regs,
        smem_static,
        smem_dynamic,
        local_mem,
        smem_executed,
        graph,
    })
}

#[inline(always)]
fn api_body(c: &mut Cur) -> Option<Api> {
    c.lit(b"api\",\"domain\":\"")?;
    let domain = c.name(&API_DOMAINS)?;
    c.lit(b",\"name\":")?;
    let name = StrId(c.u32()?);
    c.lit(b",\"cbid\":")?;
    let cbid = c.u32()?;
    c.lit(b",\"start\":")?;
    let start = c.u64_long()?;
    c.lit(b",\"end\":")?;
    let end = c.u64_long()?;
    c.lit(b",\"tid\":")?;
    let tid = c.u64()?;
    c.lit(b",\"corr\":")?;
    let corr = c.u32()?;
    c.lit(b",\"ret\":")?;
    let ret = c.u32()?;
    c.close()?;
    Some(Api {
        domain,
        name,
        cbid,
        start,
        end,
        tid,
        corr,
        ret,
    })
}

#[inline(always)]
fn sync_body(c: &mut Cur) -> Option<Sync> {
    c.lit(b"sync\",\"kind\":\"")?;
    let kind = c.name(&SYNC_KINDS)?;
    c.lit(b",\"start\":")?;
    let start = c.u64_long()?;
    c.lit(b",\"end\":")?;
    let end = c.u64_long()?;
    c.lit(b",\"ctx\":")?;
    let ctx = c.u32()?;
    // Optional keys, each present or absent, in schema order.
    let stream = if c.opt_lit(b",\"stream\":") {
        Some(c.u32()?)
    } else {
        None
    };
    let event = if c.opt_lit(b",\"event\":") {
        Some(c.u32()?)
    } else {
        None
    };
    c.lit(b",\"corr\":")?;
    let corr = c.u32()?;
    let tid = if c.opt_lit(b",\"tid\":") {
        Some(c.u64()?)
    } else {
        None
    };
    let stack = if c.opt_lit(b",\"stack\":") {
        Some(StackId(c.u32()?))
    } else {
        None
    };
    c.close()?;
    Some(Sync {
        kind,
        start,
        end,
        ctx,
        stream,
        event,
        corr,
        tid,
        stack,
    })
}

#[inline(always)]
fn memcpy_body(c: &mut Cur) -> Option<Memcpy> {
    let kind = c.name(&COPY_KINDS)?;
    c.lit(b",\"src_kind\":\"")?;
    let src_kind = c.name(&MEMORY_KINDS)?;
    c.lit(b",\"dst_kind\":\"")?;
    let dst_kind = c.name(&MEMORY_KINDS)?;
    c.lit(b",\"bytes\":")?;
    let bytes = c.u64()?;
    c.lit(b",\"start\":")?;
    let start = c.u64_long()?;
    c.lit(b",\"end\":")?;
    let end = c.u64_long()?;
    c.lit(b",\"dev\":")?;
    let dev = c.u32()?;
    c.lit(b",\"ctx\":")?;
    let ctx = c.u32()?;
    c.lit(b",\"stream\":")?;
    let stream = c.u32()?;
    c.lit(b",\"corr\":")?;
    let corr = c.u32()?;
    let graph = c.graph()?;
    c.close()?;
    Some(Memcpy {
        kind,
        src_kind,
        dst_kind,
        bytes,
        start,
        end,
        dev,
        ctx,
        stream,
        corr,
        graph,
    })
}

#[inline(always)]
fn memset_body(c: &mut Cur) -> Option<Memset> {
    c.lit(b"memset\",\"bytes\":")?;
    let bytes = c.u64()?;
    c.lit(b",\"value\":")?;
    let value = c.u32()?;
    c.lit(b",\"mem_kind\":\"")?;
    let mem_kind = c.name(&MEMORY_KINDS)?;
    c.lit(b",\"start\":")?;
    let start = c.u64_long()?;
    c.lit(b",\"end\":")?;
    let end = c.u64_long()?;
    c.lit(b",\"dev\":")?;
    let dev = c.u32()?;
    c.lit(b",\"ctx\":")?;
    let ctx = c.u32()?;
    c.lit(b",\"stream\":")?;
    let stream = c.u32()?;
    c.lit(b",\"corr\":")?;
    let corr = c.u32()?;
    let graph = c.graph()?;
    c.close()?;
    Some(Memset {
        bytes,
        value,
        mem_kind,
        start,
        end,
        dev,
        ctx,
        stream,
        corr,
        graph,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::Record;

    fn serde(line: &str) -> Option<Kernel> {
        match serde_json::from_str::<Record>(line) {
            Ok(Record::Kernel(k)) => Some(k),
            _ => None,
        }
    }

    const LINE: &str = r#"{"t":"kernel","name":0,"start":1234000100000,"end":1234000350000,"dev":0,"ctx":1,"stream":7,"corr":812,"grid":[128,1,1],"block":[256,1,1],"regs":64,"smem_static":0,"smem_dynamic":16384,"local_mem":0}"#;

    #[test]
    fn writer_shape_parses_like_serde() {
        let k = kernel(LINE.as_bytes()).unwrap();
        assert_eq!(Some(k.clone()), serde(LINE));
        let written = serde_json::to_string(&Record::Kernel(Kernel {
            name: StrId(u32::MAX),
            start: u64::MAX,
            end: 0,
            grid: [i32::MIN, -1, i32::MAX],
            regs: u16::MAX,
            smem_static: -5,
            ..k
        }))
        .unwrap();
        assert_eq!(kernel(written.as_bytes()), serde(&written));
        assert!(kernel(written.as_bytes()).is_some());
        // The optional carveout, written last when present, parses like serde; without it the
        // field is None (traces from recorders before it).
        let with = LINE.replace("}", ",\"smem_executed\":233472}");
        assert_eq!(kernel(with.as_bytes()).unwrap().smem_executed, Some(233472));
        assert_eq!(kernel(with.as_bytes()), serde(&with));
        assert_eq!(kernel(LINE.as_bytes()).unwrap().smem_executed, None);
    }

    /// Timestamps of 15 to 21 digits, with the digits after the sixteenth followed by what ends
    /// a number or by what serde_json would refuse: parsed like serde_json or left to it.
    #[test]
    fn long_timestamps_parse_like_serde() {
        let tails = ["", "0", "00", "7", "12", "345", "999", "1234", "98765"];
        let afters = [",", ".5,", "e3,", "x,"];
        for head in [
            "179532833700318",
            "1795328337003189",
            "9999999999999999",
            "1000000000000000",
        ] {
            for tail in tails {
                for after in afters {
                    let ts = format!("{head}{tail}");
                    let line = LINE.replacen(
                        &format!("\"start\":{}", start_of(LINE)),
                        &format!("\"start\":{ts}"),
                        1,
                    );
                    let line = line.replacen(&format!("{ts},"), &format!("{ts}{after}"), 1);
                    let fast = kernel(line.as_bytes());
                    if fast.is_some() {
                        assert_eq!(fast, serde(&line), "{line}");
                    } else {
                        // Left to serde_json: only what a fast parse cannot take.
                        assert!(
                            after != "," || serde(&line).is_none() || ts.len() > 19,
                            "{line}"
                        );
                    }
                }
            }
        }
    }

    fn start_of(line: &str) -> &str {
        let at = line.find("\"start\":").unwrap() + 8;
        let end = at + line[at..].find(',').unwrap();
        &line[at..end]
    }

    #[test]
    fn anything_unusual_is_left_to_serde() {
        let variants = [
            LINE.replace("\"regs\":64", "\"regs\":65536"), // u16 overflow
            LINE.replace("\"corr\":812", "\"corr\":4294967296"), // u32 overflow
            LINE.replace("\"start\":1234000100000", "\"start\":18446744073709551616"),
            LINE.replace("\"dev\":0", "\"dev\":00"), // leading zero
            LINE.replace("\"corr\":812", "\"corr\":00000812"), // leading zeros, 8 digits
            LINE.replace("\"corr\":812", "\"corr\":0000000000812"),
            LINE.replace("\"corr\":812", "\"corr\":99999999999"), // 11 digits
            LINE.replace("\"regs\":64", "\"regs\":10000000"),     // 8 digits over u16
            LINE.replace("\"dev\":0", "\"dev\":-0"),
            LINE.replace("\"smem_static\":0", "\"smem_static\":-0"),
            LINE.replace("\"smem_static\":0", "\"smem_static\":-2147483649"),
            LINE.replace("\"dev\":0", "\"dev\":0.0"),
            LINE.replace("\"dev\":0", "\"dev\":1e2"),
            LINE.replace(",\"ctx\"", ", \"ctx\""), // whitespace
            LINE.replace("}", ",\"extra\":1}"),    // unknown field
            LINE.replace(",\"local_mem\":0", ""),  // missing field
            LINE.replace("[128,1,1]", "[128,1]"),
            LINE.replace("}", ",\"smem_executed\":-1}"), // negative u32
            LINE.replace("}", ",\"smem_executed\":4294967296}"),
            LINE.replace("}", ",\"smem_executed\":1,\"local_mem\":0}"), // a key after it
            LINE.replace(",\"local_mem\":0}", ",\"smem_executed\":1,\"local_mem\":0}"),
            format!("{LINE} "),
            LINE.replace(
                "\"name\":0,\"start\":1234000100000",
                "\"start\":1234000100000,\"name\":0",
            ),
        ];
        for v in &variants {
            assert_eq!(kernel(v.as_bytes()), None, "{v}");
        }
        for (corr, want) in [
            ("12345678", 12_345_678),
            ("123456789", 123_456_789),
            ("4294967295", u32::MAX),
            ("10000000", 10_000_000),
        ] {
            let v = LINE.replace("\"corr\":812", &format!("\"corr\":{corr}"));
            assert_eq!(kernel(v.as_bytes()).map(|k| k.corr), Some(want), "{v}");
            assert_eq!(kernel(v.as_bytes()), serde(&v));
        }
        assert_eq!(
            kernel(
                LINE.replace("\"smem_static\":0", "\"smem_static\":-2147483648")
                    .as_bytes()
            )
            .map(|k| k.smem_static),
            Some(i32::MIN)
        );
    }

    /// xorshift: the tests' own reproducible randomness.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        /// A value of every width: 0, small, around the limits of u16, u32 and u64.
        fn num(&mut self) -> u64 {
            match self.below(6) {
                0 => 0,
                1 => self.below(10),
                2 => self.below(100_000),
                3 => u32::MAX as u64 - self.below(3),
                4 => u64::MAX - self.below(3),
                _ => self.next() >> self.below(64),
            }
        }
    }

    /// Records of the five types the fast path reads, with every optional field present or not
    /// and every enum value.
    fn graph(rng: &mut Rng) -> Option<GraphNode> {
        (rng.below(3) == 0).then(|| GraphNode(rng.num() as u32, rng.num()))
    }

    fn records(rng: &mut Rng) -> Vec<Record> {
        let mut out = Vec::new();
        for i in 0..400u64 {
            let n = |r: &mut Rng| r.num();
            let opt = |r: &mut Rng| (r.below(2) == 0).then(|| r.num() as u32);
            let i32s = |r: &mut Rng| r.num() as i32;
            let kinds = [
                MemoryKind::Pageable,
                MemoryKind::Pinned,
                MemoryKind::Device,
                MemoryKind::Array,
                MemoryKind::Managed,
                MemoryKind::DeviceStatic,
                MemoryKind::ManagedStatic,
                MemoryKind::Unknown,
            ];
            let mk = |r: &mut Rng| kinds[r.below(kinds.len() as u64) as usize];
            out.push(Record::Kernel(Kernel {
                name: StrId(n(rng) as u32),
                start: n(rng),
                end: n(rng),
                dev: n(rng) as u32,
                ctx: n(rng) as u32,
                stream: n(rng) as u32,
                corr: n(rng) as u32,
                grid: [i32s(rng), i32s(rng), i32s(rng)],
                block: [i32s(rng), i32s(rng), i32s(rng)],
                regs: n(rng) as u16,
                smem_static: i32s(rng),
                smem_dynamic: i32s(rng),
                local_mem: n(rng) as u32,
                smem_executed: opt(rng),
                graph: graph(rng),
            }));
            out.push(Record::Api(Api {
                domain: [ApiDomain::Runtime, ApiDomain::Driver, ApiDomain::Unknown][i as usize % 3],
                name: StrId(n(rng) as u32),
                cbid: n(rng) as u32,
                start: n(rng),
                end: n(rng),
                tid: n(rng),
                corr: n(rng) as u32,
                ret: n(rng) as u32,
            }));
            out.push(Record::Sync(Sync {
                kind: [
                    SyncKind::EventSynchronize,
                    SyncKind::StreamWaitEvent,
                    SyncKind::StreamSynchronize,
                    SyncKind::ContextSynchronize,
                    SyncKind::Unknown,
                ][i as usize % 5],
                start: n(rng),
                end: n(rng),
                ctx: n(rng) as u32,
                stream: opt(rng),
                event: opt(rng),
                corr: n(rng) as u32,
                tid: (rng.below(2) == 0).then(|| rng.num()),
                stack: opt(rng).map(StackId),
            }));
            out.push(Record::Memcpy(Memcpy {
                kind: COPY_KINDS[i as usize % COPY_KINDS.len()].1,
                src_kind: mk(rng),
                dst_kind: mk(rng),
                bytes: n(rng),
                start: n(rng),
                end: n(rng),
                dev: n(rng) as u32,
                ctx: n(rng) as u32,
                stream: n(rng) as u32,
                corr: n(rng) as u32,
                graph: graph(rng),
            }));
            out.push(Record::Memset(Memset {
                bytes: n(rng),
                value: n(rng) as u32,
                mem_kind: mk(rng),
                start: n(rng),
                end: n(rng),
                dev: n(rng) as u32,
                ctx: n(rng) as u32,
                stream: n(rng) as u32,
                corr: n(rng) as u32,
                graph: graph(rng),
            }));
        }
        out
    }

    #[test]
    fn written_records_of_every_fast_type_parse_like_serde() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for rec in records(&mut rng) {
            let line = serde_json::to_string(&rec).unwrap();
            assert_eq!(record(line.as_bytes()).as_ref(), Some(&rec), "{line}");
        }
    }

    /// Whatever the fast path accepts of a damaged line, serde_json reads the same: bytes
    /// replaced (by digits, signs, quotes, brackets, letters, spaces), removed or repeated.
    #[test]
    fn damaged_lines_are_parsed_like_serde_or_left_to_it() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let alphabet = b"0123456789-+.eE,:\"{}[] \\aDHtoxkn\x00\xff";
        let (mut accepted, mut left) = (0, 0);
        for rec in records(&mut rng) {
            let line = serde_json::to_string(&rec).unwrap().into_bytes();
            for _ in 0..40 {
                let mut l = line.clone();
                for _ in 0..1 + rng.below(2) {
                    let at = rng.below(l.len() as u64) as usize;
                    match rng.below(3) {
                        0 => l[at] = alphabet[rng.below(alphabet.len() as u64) as usize],
                        1 => {
                            l.remove(at);
                        }
                        _ => l.insert(at, l[at]),
                    }
                }
                match record(&l) {
                    Some(fast) => {
                        accepted += 1;
                        let slow = serde_json::from_slice::<Record>(&l).ok();
                        assert_eq!(Some(fast), slow, "{}", String::from_utf8_lossy(&l));
                    }
                    None => left += 1,
                }
            }
        }
        // Both outcomes are exercised.
        assert!(
            accepted > 1000 && left > 1000,
            "{accepted} accepted, {left} left"
        );
    }
    /// A kernel line with the given head fields and tail (from `,"grid":` on, `}` included).
    fn kline(name: u32, start: u64, corr: u32, tail: &str) -> String {
        format!(
            "{{\"t\":\"kernel\",\"name\":{name},\"start\":{start},\"end\":{},\"dev\":0,\"ctx\":1,\"stream\":7,\"corr\":{corr}{tail}",
            start + 5381
        )
    }

    const TAIL: &str = ",\"grid\":[192,3,1],\"block\":[512,1,1],\"regs\":40,\"smem_static\":8192,\"smem_dynamic\":0,\"local_mem\":0,\"smem_executed\":233472}";

    /// Each line through `p` (twice) gives what the uncached parse and serde_json give.
    fn same_as_uncached(p: &mut Parser, lines: &[String]) {
        for l in lines.iter().chain(lines) {
            let cached = p.record(l.as_bytes());
            assert_eq!(cached, record(l.as_bytes()), "{l}");
            if let Some(r) = cached {
                assert_eq!(Some(r), serde_json::from_str::<Record>(l).ok(), "{l}");
            }
        }
    }

    /// The same tail behind different leading fields, tails a digit apart, with and without
    /// `smem_executed` and `graph`, and damaged ones next to good ones of the same bytes: the
    /// cached parse is the parse.
    #[test]
    fn cached_configurations_are_parsed_configurations() {
        let mut lines = Vec::new();
        for (i, tail) in [
            TAIL.to_string(),
            TAIL.replace("\"regs\":40", "\"regs\":41"),
            TAIL.replace("[192,3,1]", "[193,3,1]"),
            TAIL.replace("[512,1,1]", "[512,1,2]"),
            TAIL.replace("233472}", "233473}"),
            TAIL.replace("\"local_mem\":0", "\"local_mem\":1"),
            TAIL.replace("\"smem_dynamic\":0", "\"smem_dynamic\":-1"),
            TAIL.replace(",\"smem_executed\":233472", ""),
            TAIL.replace("}", ",\"graph\":[3,17]}"),
            TAIL.replace("}", ",\"graph\":[4,18]}"),
            TAIL.replace(",\"smem_executed\":233472}", ",\"graph\":[3,17]}"),
            // Left to serde_json (the first four) or parsed as serde_json parses them.
            TAIL.replace("}", ",\"graph\":[3,x]}"),
            TAIL.replace("}", ",\"graph\":[3,17],\"graph\":[3,17]}"),
            TAIL.replace("233472}", "233472 }"),
            TAIL.replace("233472}", "233472"),
            TAIL.replace("233472}", "2334720}"),
            TAIL.replace("\"local_mem\":0", "\"local_mem\":00"),
            TAIL.replace(",\"smem_executed\":233472}", "}"),
            TAIL.replace("}", "]}"),
            TAIL.replace("}", "}}"),
        ]
        .iter()
        .enumerate()
        {
            for (name, start, corr) in [(2, 1795328337000208033, 170), (9, 17, 99_999_999)] {
                lines.push(kline(name + i as u32, start, corr, tail));
            }
        }
        let mut p = Parser::new();
        same_as_uncached(&mut p, &lines);
        // The second pass over the lines came from the cache, where they are valid.
        let valid = lines
            .iter()
            .filter(|l| record(l.as_bytes()).is_some())
            .count() as u64;
        assert!(p.tails.hits >= valid, "{} hits", p.tails.hits);
        // A line the same but for its head takes its head from its bytes.
        let k = kernel(kline(5, 123, 456, TAIL).as_bytes()).unwrap();
        match p.record(kline(5, 123, 456, TAIL).as_bytes()) {
            Some(Record::Kernel(c)) => assert_eq!((c.name, c.start, c.corr), (StrId(5), 123, 456)),
            other => panic!("{other:?}"),
        }
        assert_eq!(k.grid, [192, 3, 1]);
    }

    /// Tails that fall in the same set (more than it has ways), parsed in turns: each is told
    /// apart by its bytes.
    #[test]
    fn tails_of_one_set_are_told_apart() {
        let tail = |regs: u32| TAIL.replace("\"regs\":40", &format!("\"regs\":{regs}"));
        let key = |t: &str| t[..t.len() - 1].to_string();
        let want = set_of(key(&tail(40)).as_bytes());
        let same: Vec<String> = (41..100_000)
            .map(tail)
            .filter(|t| set_of(key(t).as_bytes()) == want)
            .take(2 * WAYS)
            .collect();
        assert_eq!(same.len(), 2 * WAYS);
        let mut lines = vec![kline(1, 1 << 60, 7, &tail(40))];
        for (i, t) in same.iter().enumerate() {
            lines.push(kline(i as u32, (1 << 60) + i as u64, 8 + i as u32, t));
        }
        let mut p = Parser::new();
        for _ in 0..3 {
            same_as_uncached(&mut p, &lines);
        }
        // Two tails of one set taking turns both stay.
        let mut p = Parser::new();
        same_as_uncached(&mut p, &lines[..2]);
        assert_eq!(p.tails.hits, 2);
    }

    /// Lines of a few configurations, damaged anywhere, through one parser among good lines of
    /// the same configurations: the same records as without the cache.
    #[test]
    fn damaged_lines_through_the_cache() {
        let mut rng = Rng(0x5851_f42d_4c95_7f2d);
        let alphabet = b"0123456789-+.eE,:\"{}[] \\aDHtoxkn\x00\xff";
        let tails = [
            TAIL.to_string(),
            TAIL.replace(",\"smem_executed\":233472", ""),
            TAIL.replace("}", ",\"graph\":[3,17]}"),
            TAIL.replace("[192,3,1]", "[-7,0,2147483647]"),
        ];
        let mut p = Parser::new();
        let mut accepted = 0;
        for i in 0..20_000u64 {
            let tail = &tails[rng.below(tails.len() as u64) as usize];
            let good = kline(i as u32 % 3, 1_795_328_337_000_208_033 + i, i as u32, tail);
            let mut l = good.clone().into_bytes();
            for _ in 0..1 + rng.below(2) {
                // Mostly in the tail.
                let from = if rng.below(4) == 0 {
                    0
                } else {
                    l.len() - tail.len()
                };
                let at = from + rng.below((l.len() - from) as u64) as usize;
                match rng.below(3) {
                    0 => l[at] = alphabet[rng.below(alphabet.len() as u64) as usize],
                    1 => {
                        l.remove(at);
                    }
                    _ => l.insert(at, l[at]),
                }
            }
            for line in [&l, good.as_bytes()] {
                let cached = p.record(line);
                assert_eq!(cached, record(line), "{}", String::from_utf8_lossy(line));
                if let Some(r) = cached {
                    accepted += 1;
                    let slow = serde_json::from_slice::<Record>(line).ok();
                    assert_eq!(Some(r), slow, "{}", String::from_utf8_lossy(line));
                }
            }
        }
        assert!(
            accepted > 21_000 && p.tails.hits > 20_000,
            "{accepted} accepted, {} hits",
            p.tails.hits
        );
    }
}
