//! Fuzzing on stable Rust (issue 13): the real sessions under `testdata/` mutated with a seeded
//! RNG (truncations, byte flips, splices, odd numbers, huge ids, deep nesting, control characters,
//! header and end-record tricks, zstd frame tricks), each fed through what `gpufl report`,
//! `report --json`, `info` and `dump` run, in this process. Checked per input: no panic
//! (`catch_unwind`), at most [`MEM_CAP`] bytes of heap (a counting allocator: going over prints the
//! seed and aborts), at most [`TIME_CAP`] (a watchdog thread prints the seed and aborts).
//!
//! `cargo test -p gpufl-cli --bin gpufl fuzz` runs it for `GPUFL_FUZZ_SECS` seconds (default 15)
//! from seed `GPUFL_FUZZ_SEED` (default: from the clock, printed). A finding names its seed; to
//! replay one input: `GPUFL_FUZZ_SEED=<seed> GPUFL_FUZZ_INPUTS=1 cargo test -p gpufl-cli --bin
//! gpufl fuzz -- --nocapture` (`GPUFL_FUZZ_KEEP=DIR` also writes the input there).
//! docs/robustness.md has the long runs.

use crate::options::fuzz as knobs;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Heap one input may hold at once (with what the test binary holds besides).
pub const MEM_CAP: usize = 1 << 30;
/// Time one input may take: 10 s in an optimized build (`--release`, how the long runs are
/// done); an unoptimized build (plain `cargo test`, ~10× slower) gets 60 s, so CI does not fail on
/// an input that is only slow for being unoptimized.
pub const TIME_CAP: Duration = Duration::from_secs(if cfg!(debug_assertions) { 60 } else { 10 });

/// Counts live heap bytes; over [`MEM_CAP`] while an input runs, reports it and aborts.
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static ARMED: AtomicBool = AtomicBool::new(false);
/// Seed of the input being run (for the allocator's and the watchdog's reports).
static SEED: AtomicU64 = AtomicU64::new(0);
/// When the current input started, in [`now_ms`] (0: none running).
static STARTED_MS: AtomicU64 = AtomicU64::new(0);

/// Write to stderr without allocating.
fn raw_stderr(msg: &[u8]) {
    // SAFETY: write(2) on fd 2 with a valid buffer.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
    }
}

fn raw_number(mut n: u64) -> ([u8; 20], usize) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    (buf, i)
}

fn die(what: &[u8]) -> ! {
    raw_stderr(b"\nfuzz: input with seed ");
    let (b, i) = raw_number(SEED.load(Ordering::Relaxed));
    raw_stderr(&b[i..]);
    raw_stderr(b" ");
    raw_stderr(what);
    raw_stderr(b" (replay: GPUFL_FUZZ_SEED=<seed> GPUFL_FUZZ_INPUTS=1)\n");
    std::process::abort();
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        if live > MEM_CAP && ARMED.load(Ordering::Relaxed) {
            die(b"went over the 1 GiB heap cap");
        }
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            let grow = new_size - layout.size();
            let live = LIVE.fetch_add(grow, Ordering::Relaxed) + grow;
            if live > MEM_CAP && ARMED.load(Ordering::Relaxed) {
                die(b"went over the 1 GiB heap cap");
            }
            PEAK.fetch_max(live, Ordering::Relaxed);
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        // SAFETY: forwarded as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// splitmix64: small, seedable, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

/// One corpus entry: a session's trace files, compressed as on disk and decompressed.
struct Seed {
    name: String,
    zst: Vec<Vec<u8>>,
    plain: Vec<Vec<u8>>,
}

fn corpus() -> Vec<Seed> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/sessions");
    let mut out = Vec::new();
    for dir in gpufl_trace::session::find_sessions(&root) {
        let Ok(files) = gpufl_trace::session::trace_files(&dir) else {
            continue;
        };
        let zst: Vec<Vec<u8>> = files.iter().filter_map(|f| std::fs::read(f).ok()).collect();
        let plain: Vec<Vec<u8>> = zst
            .iter()
            .map(|b| zstd::decode_all(&b[..]).unwrap_or_else(|_| b.clone()))
            .collect();
        out.push(Seed {
            name: dir.file_name().unwrap().to_string_lossy().into_owned(),
            zst,
            plain,
        });
    }
    out
}

/// Numbers a hostile trace may hold where ids, times, counts and sizes go.
const ODD_NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "-0",
    "255",
    "65535",
    "65536",
    "2147483647",
    "-2147483648",
    "4294967295",
    "4294967296",
    "200000000",
    "9007199254740993",
    "18446744073709551615",
    "18446744073709551616",
    "1e300",
    "0.5",
    "null",
    "\"7\"",
    "[]",
    "{}",
];

const NASTY_STRINGS: &[&str] = &[
    "\\u001b[2J\\u001b[H",
    "\\u001b]0;owned\\u0007",
    "a\\nfix: rm -rf ~",
    "\\r\\u009b31m",
    "\\u202eevil\\u2066",
    "",
    "\\ud800",
    "日本語 🚀",
];

/// A zstd frame of `total` bytes of `byte` in RLE blocks, declaring its size or not.
fn rle_frame(byte: u8, total: u64, declare: bool) -> Vec<u8> {
    let mut f = vec![0x28, 0xb5, 0x2f, 0xfd];
    if declare {
        f.extend([0xc0, 0x38]);
        f.extend(total.to_le_bytes());
    } else {
        f.extend([0x00, 0x38]);
    }
    let mut left = total;
    while left > 0 {
        let n = left.min(128 << 10);
        left -= n;
        let hdr = u32::from(left == 0) | (1 << 1) | ((n as u32) << 3);
        f.extend(&hdr.to_le_bytes()[..3]);
        f.push(byte);
    }
    f
}

/// Positions of the line starts of `b`.
fn line_starts(b: &[u8]) -> Vec<usize> {
    let mut v = vec![0];
    v.extend(
        memchr_all(b)
            .into_iter()
            .map(|i| i + 1)
            .filter(|&i| i < b.len()),
    );
    v
}

fn memchr_all(b: &[u8]) -> Vec<usize> {
    b.iter()
        .enumerate()
        .filter(|(_, &c)| c == b'\n')
        .map(|(i, _)| i)
        .collect()
}

/// A hostile line or block of lines.
fn hostile_lines(rng: &mut Rng) -> String {
    let id = rng.pick(&["0", "7", "4294967295", "200000000", "4294967294"]);
    match rng.below(14) {
        13 => graph_work(rng, id),
        12 => many_streams(rng),
        0 => format!("{{\"t\":\"str\",\"id\":{id},\"s\":\"{}\"}}\n", rng.pick(NASTY_STRINGS)),
        1 => format!(
            "{{\"t\":\"frame\",\"id\":{id},\"kind\":\"python\",\"func\":{},\"file\":{},\"line\":{}}}\n",
            rng.pick(ODD_NUMBERS),
            id,
            rng.pick(ODD_NUMBERS)
        ),
        2 => format!(
            "{{\"t\":\"stack\",\"id\":{id},\"frames\":[{},{},{}]}}\n",
            id,
            rng.pick(ODD_NUMBERS),
            id
        ),
        3 => deep_scopes(rng),
        4 => format!(
            "{{\"t\":\"header\",\"format\":\"{}\",\"version\":{},\"gpufl_version\":\"x\",\"session_id\":\"{}\",\"app_name\":\"a\",\"host\":\"{}\",\"pid\":1,\"ppid\":0,\"command_line\":[\"{}\"],\"start_unix_ns\":{},\"clock\":{{\"trace_ns\":{},\"unix_ns\":0}},\"gpus\":[],\"options\":{{\"enable_synchronization\":true,\"enable_stack_trace\":true,\"api_records\":\"sync\",\"log_path\":\"/\",\"started_by\":\"test\",\"mode\":\"always-on\"}},\"capture\":{{\"status\":\"partial\",\"reason\":\"{}\"}}}}\n",
            rng.pick(&["gpufl-trace", "other", ""]),
            rng.pick(&["0", "1", "2", "4294967295"]),
            rng.pick(NASTY_STRINGS),
            rng.pick(NASTY_STRINGS),
            rng.pick(NASTY_STRINGS),
            rng.pick(&["0", "18446744073709551615"]),
            rng.pick(&["0", "18446744073709551615", "1"]),
            rng.pick(NASTY_STRINGS),
        ),
        5 => format!(
            "{{\"t\":\"end\",\"end_unix_ns\":1,\"reason\":\"exit\",\"counts\":{{\"kernels\":{},\"memcpys\":0,\"memsets\":0,\"syncs\":{},\"apis\":0,\"stacks\":0,\"dropped\":{}}}}}\n",
            rng.pick(&["0", "5", "18446744073709551615"]),
            rng.pick(&["0", "1"]),
            rng.pick(&["0", "18446744073709551615"])
        ),
        6 => format!("{{\"t\":\"{}\",\"x\":1}}\n", rng.pick(NASTY_STRINGS)),
        7 => {
            // A long line (within and beyond the reader's 16 MiB limit only rarely: it is slow).
            let n = if rng.chance(5) { 17 << 20 } else { 1 + rng.below(2 << 20) };
            format!(
                "{{\"t\":\"notice\",\"level\":\"warning\",\"message\":\"{}\"}}\n",
                "y".repeat(n)
            )
        }
        8 => format!(
            "{{\"t\":\"kernel\",\"name\":{id},\"start\":{},\"end\":{},\"dev\":{},\"ctx\":{},\"stream\":{},\"corr\":{},\"grid\":[{},1,1],\"block\":[{},1,1],\"regs\":{},\"smem_static\":0,\"smem_dynamic\":{},\"local_mem\":0}}\n",
            rng.pick(ODD_NUMBERS),
            rng.pick(ODD_NUMBERS),
            rng.pick(&["0", "4294967295", "7"]),
            rng.pick(&["0", "4294967295"]),
            rng.pick(&["0", "4294967295"]),
            rng.pick(ODD_NUMBERS),
            rng.pick(&["0", "-1", "2147483647", "-2147483648"]),
            rng.pick(&["0", "-1", "1024", "2147483647"]),
            rng.pick(&["0", "255", "65535"]),
            rng.pick(&["0", "-1", "2147483647"]),
        ),
        9 => format!(
            "{{\"t\":\"telemetry\",\"ts\":{},\"dev\":{},\"gpu_util\":{},\"mem_used\":{},\"mem_total\":{}}}\n",
            rng.pick(ODD_NUMBERS),
            rng.pick(&["0", "4294967295"]),
            rng.pick(&["0", "100", "4294967295"]),
            rng.pick(ODD_NUMBERS),
            rng.pick(ODD_NUMBERS)
        ),
        10 => format!(
            "{{\"t\":\"window\",\"start\":{},\"end\":{},\"reason\":\"{}\"}}\n{{\"t\":\"capture\",\"ts\":{},\"recording\":{}}}\n",
            rng.pick(ODD_NUMBERS),
            rng.pick(ODD_NUMBERS),
            rng.pick(NASTY_STRINGS),
            rng.pick(ODD_NUMBERS),
            rng.pick(&["true", "false"])
        ),
        _ => format!(
            "{{\"t\":\"sync\",\"kind\":\"context_synchronize\",\"start\":{},\"end\":{},\"ctx\":1,\"corr\":{},\"tid\":{},\"stack\":{id}}}\n",
            rng.pick(ODD_NUMBERS),
            rng.pick(ODD_NUMBERS),
            rng.pick(ODD_NUMBERS),
            rng.pick(&["1", "0", "18446744073709551615"])
        ),
    }
}

/// CUDA graph work: replays (kernels with a graph node, many per correlation id or one
/// each), graph nodes cloned in chains and cycles, generated kernels' sources.
fn graph_work(rng: &mut Rng, id: &str) -> String {
    let max = if rng.chance(20) { 60_000 } else { 3_000 };
    let n = 1 + rng.below(max);
    let per = 1 + rng.below(64);
    let max_graphs = if rng.chance(20) { 5_000 } else { 4 };
    let graphs = 1 + rng.below(max_graphs);
    let mut s = String::with_capacity(n * 260);
    for i in 0..n {
        let node = if rng.chance(50) { i % 7 } else { i };
        s += &format!(
            "{{\"t\":\"kernel\",\"name\":{},\"start\":{},\"end\":{},\"dev\":0,\"ctx\":1,\"stream\":7,\"corr\":{},\"grid\":[1,1,1],\"block\":[32,1,1],\"regs\":8,\"smem_static\":0,\"smem_dynamic\":0,\"local_mem\":0,\"graph\":[{},{node}]}}\n",
            i % 5,
            1000 + i * 10,
            if rng.chance(5) { rng.pick(ODD_NUMBERS).to_string() } else { (1005 + i * 10).to_string() },
            i / per,
            i % graphs,
        );
        if rng.chance(10) {
            s += &format!(
                "{{\"t\":\"gnode\",\"graph\":{},\"node\":{node},\"from\":[1,{}]}}\n",
                i % graphs,
                if rng.chance(50) { node } else { (node + 1) % 7 }
            );
        }
    }
    s += &format!(
        "{{\"t\":\"gnode\",\"graph\":{id},\"node\":{},\"stack\":{id},\"tid\":{}}}\n",
        rng.pick(ODD_NUMBERS),
        rng.pick(ODD_NUMBERS)
    );
    s += &format!(
        "{{\"t\":\"function\",\"name\":{id},\"module\":0,\"source\":{{\"file\":{id},\"line\":{},\"note\":{id}}}}}\n",
        rng.pick(ODD_NUMBERS)
    );
    s
}

/// Many distinct devices, contexts and streams (per-device and per-stream work must
/// stay linear).
fn many_streams(rng: &mut Rng) -> String {
    let max = if rng.chance(20) { 60_000 } else { 5_000 };
    let n = 1 + rng.below(max);
    let (d, c) = (rng.chance(50), rng.chance(70));
    let mut s = String::with_capacity(n * 300);
    for i in 0..n {
        let dev = if d { i } else { i % 2 };
        let ctx = if c { i } else { 1 };
        s += &format!(
            "{{\"t\":\"stream\",\"ctx\":{ctx},\"stream\":{i},\"role\":\"{}\"}}\n{{\"t\":\"memcpy\",\"kind\":\"HtoD\",\"src_kind\":\"pageable\",\"dst_kind\":\"device\",\"bytes\":4,\"start\":{},\"end\":{},\"dev\":{dev},\"ctx\":{ctx},\"stream\":{i},\"corr\":{i}}}\n{{\"t\":\"telemetry\",\"ts\":{},\"dev\":{dev},\"gpu_util\":5}}\n",
            if i % 3 == 0 { "legacy_default" } else { "other" },
            1000 + i * 10,
            1004 + i * 10,
            1000 + i * 10
        );
    }
    s
}

/// Deep nesting, on one thread or interleaved with closes.
fn deep_scopes(rng: &mut Rng) -> String {
    let max = if rng.chance(20) { 120_000 } else { 3_000 };
    let n = 1 + rng.below(max);
    let tid = rng.pick(&["1", "0", "18446744073709551615"]);
    let mut s = String::with_capacity(n * 64);
    for i in 0..n {
        s += &format!(
            "{{\"t\":\"scope\",\"ts\":{},\"tid\":{tid},\"name\":{},\"depth\":{i},\"source\":\"nvtx\"}}\n",
            1000 + i,
            i % 7
        );
    }
    if rng.chance(50) {
        for i in 0..n {
            s += &format!(
                "{{\"t\":\"scope\",\"ts\":{},\"tid\":{tid},\"name\":0,\"depth\":{},\"end\":true,\"source\":\"api\"}}\n",
                1000 + n + i,
                n - i - 1
            );
        }
    }
    s
}

/// Mutate text (NDJSON) in place: one of the text-level mutations.
fn mutate_text(rng: &mut Rng, b: &mut Vec<u8>, other: &[u8]) -> &'static str {
    let len = b.len();
    match rng.below(10) {
        0 => {
            b.truncate(rng.below(len + 1));
            "truncate"
        }
        1 => {
            for _ in 0..1 + rng.below(16) {
                if !b.is_empty() {
                    let i = rng.below(b.len());
                    b[i] ^= 1 << rng.below(8);
                }
            }
            "flip bits"
        }
        2 => {
            // Splice a range of another input in.
            if !other.is_empty() {
                let a = rng.below(other.len());
                let n = rng.below((other.len() - a).min(64 << 10) + 1);
                let at = rng.below(len + 1);
                b.splice(at..at, other[a..a + n].iter().copied());
            }
            "splice"
        }
        3 => {
            // Duplicate a run of lines.
            let starts = line_starts(b);
            let i = rng.below(starts.len());
            let j = (i + 1 + rng.below(200)).min(starts.len());
            let end = starts.get(j).copied().unwrap_or(len);
            let chunk = b[starts[i]..end].to_vec();
            let times = 1 + rng.below(3);
            for _ in 0..times {
                b.splice(end..end, chunk.iter().copied());
            }
            "duplicate lines"
        }
        4 => {
            let starts = line_starts(b);
            let i = rng.below(starts.len());
            let j = (i + 1 + rng.below(50)).min(starts.len());
            let end = starts.get(j).copied().unwrap_or(len);
            b.drain(starts[i]..end);
            "delete lines"
        }
        5 | 6 => {
            // Replace a number with an odd one, a few times.
            for _ in 0..1 + rng.below(8) {
                if b.is_empty() {
                    break;
                }
                let mut i = rng.below(b.len());
                while i < b.len() && !b[i].is_ascii_digit() {
                    i += 1;
                }
                let mut j = i;
                while j < b.len() && b[j].is_ascii_digit() {
                    j += 1;
                }
                if i < j {
                    let n = rng.pick(ODD_NUMBERS).as_bytes().to_vec();
                    b.splice(i..j, n);
                }
            }
            "odd numbers"
        }
        7 => {
            // Replace the content of a string value with something nasty.
            if !b.is_empty() {
                let i = rng.below(b.len());
                if let Some(q) = b[i..].iter().position(|&c| c == b':') {
                    let at = i + q + 1;
                    if b.get(at) == Some(&b'"') {
                        if let Some(e) = b[at + 1..].iter().position(|&c| c == b'"') {
                            let s = rng.pick(NASTY_STRINGS).as_bytes().to_vec();
                            b.splice(at + 1..at + 1 + e, s);
                        }
                    }
                }
            }
            "nasty string"
        }
        8 => {
            let starts = line_starts(b);
            let at = *rng.pick(&starts);
            let lines = hostile_lines(rng);
            b.splice(at..at, lines.into_bytes());
            "hostile lines"
        }
        _ => {
            let starts = line_starts(b);
            if starts.len() > 2 {
                let (i, j) = (rng.below(starts.len() - 1), rng.below(starts.len() - 1));
                let li = b[starts[i]..starts[i + 1]].to_vec();
                let lj = b[starts[j]..starts[j + 1]].to_vec();
                if i < j {
                    b.splice(starts[j]..starts[j + 1], li);
                    b.splice(starts[i]..starts[i + 1], lj);
                }
            }
            "swap lines"
        }
    }
}

/// Compress text into zstd blocks: one, or many small ones (lines kept whole, as the writer).
fn compress(rng: &mut Rng, text: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let chunk = if rng.chance(50) {
        usize::MAX
    } else {
        1 + rng.below(64 << 10)
    };
    let mut at = 0;
    while at < text.len() {
        let mut end = at.saturating_add(chunk).min(text.len());
        if rng.chance(90) {
            if let Some(nl) = text[end..].iter().position(|&c| c == b'\n') {
                end += nl + 1;
            } else {
                end = text.len();
            }
        }
        let mut enc = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
        let _ = enc.include_checksum(rng.chance(80));
        use std::io::Write;
        enc.write_all(&text[at..end]).unwrap();
        out.extend(enc.finish().unwrap());
        at = end;
    }
    out
}

/// Zstd-level tricks on compressed bytes.
fn mutate_zstd(rng: &mut Rng, b: &mut Vec<u8>) -> &'static str {
    match rng.below(7) {
        0 => {
            // A decompression bomb after the real blocks: usually small enough to read, sometimes
            // over the 256 MiB block limit.
            let size = if rng.chance(10) {
                300 << 20
            } else {
                rng.below(40 << 20) as u64
            };
            let byte = *rng.pick(&[0u8, b'\n', b'{', b'x']);
            b.extend(rle_frame(byte, size, rng.chance(50)));
            "rle bomb"
        }
        1 => {
            // A frame header asking for a huge window.
            b.extend([0x28, 0xb5, 0x2f, 0xfd, 0x00, 0xf8, 0x01, 0x00, 0x00]);
            "huge window"
        }
        2 => {
            // A skippable frame (legal zstd, not a block of ours).
            b.extend([0x50, 0x2a, 0x4d, 0x18, 0x04, 0, 0, 0, 1, 2, 3, 4]);
            "skippable frame"
        }
        3 => {
            let c = b.clone();
            b.extend(c);
            "concatenated with itself"
        }
        4 => {
            b.truncate(rng.below(b.len() + 1));
            "truncate compressed"
        }
        5 => {
            for _ in 0..1 + rng.below(8) {
                if !b.is_empty() {
                    let i = rng.below(b.len());
                    b[i] = rng.next() as u8;
                }
            }
            "flip compressed bytes"
        }
        _ => {
            // Bytes that are not zstd after the magic.
            b.extend([0x28, 0xb5, 0x2f, 0xfd]);
            b.extend((0..rng.below(64)).map(|_| rng.next() as u8));
            "garbage frame"
        }
    }
}

/// One input: the files of a session directory, and what was done to them.
struct Input {
    files: Vec<(String, Vec<u8>)>,
    how: Vec<&'static str>,
}

fn make_input(seed: u64, corpus: &[Seed]) -> Input {
    let mut rng = Rng(seed);
    let s = rng.pick(corpus);
    let other = rng.pick(corpus);
    let mut how = vec![];
    let mut files = Vec::new();
    let nfiles = if rng.chance(15) { 2 } else { 1 };
    for f in 0..nfiles {
        let k = rng.below(s.plain.len());
        let name = format!("trace-{f:04}.ndjson");
        let bytes = if rng.chance(25) {
            // Compressed bytes as recorded, mutated at the zstd level.
            let mut b = s.zst[k].clone();
            for _ in 0..1 + rng.below(2) {
                how.push(mutate_zstd(&mut rng, &mut b));
            }
            b
        } else {
            let mut b = s.plain[k].clone();
            let o = &other.plain[rng.below(other.plain.len())];
            for _ in 0..1 + rng.below(4) {
                how.push(mutate_text(&mut rng, &mut b, o));
            }
            if rng.chance(60) {
                let mut z = compress(&mut rng, &b);
                if rng.chance(20) {
                    how.push(mutate_zstd(&mut rng, &mut z));
                }
                z
            } else {
                b
            }
        };
        let suffix = if bytes.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            ".zst"
        } else {
            ""
        };
        files.push((format!("{name}{suffix}"), bytes));
    }
    how.insert(0, "from");
    let _ = &s.name;
    Input { files, how }
}

/// Run what the CLI runs on a session directory: report (text and JSON), info, diff (with
/// itself), export (both formats), dump (resolved and raw). Returns the bytes of output (so
/// nothing is optimized away).
fn run_cli_paths(dir: &Path) -> usize {
    let mut n = 0;
    let cfg = gpufl_analysis::Config::default();
    if let Ok(r) = crate::report::load(dir, &cfg, 1) {
        let reports = [r];
        n += crate::report::render_text(&reports, false).len();
        let json = crate::report::render_json(&reports).ok();
        n += json.as_ref().map_or(0, |s| s.len());
        // The parallel reader and analysis make the same report.
        let par = crate::report::load(dir, &cfg, 3).ok().map(|r| [r]);
        let par_json = par
            .as_ref()
            .and_then(|r| crate::report::render_json(r).ok());
        assert!(par_json == json, "3 threads report differently from 1");
    }
    n += crate::summary::info_text(dir).map_or(0, |s| s.len());
    // Diff: a session against itself shows nothing and regresses nothing, at any threshold.
    if let Ok((side, p)) = crate::diff::load(dir, &cfg, 1) {
        let opts = gpufl_analysis::diff::Options {
            threshold_pct: 0.0,
            fail_on_regression_pct: Some(0.0),
        };
        let d = gpufl_analysis::diff::diff(&p, &p, &opts).expect("valid options");
        assert!(
            d.is_unchanged() && !d.regressed(),
            "a session differs from itself"
        );
        n += crate::diff::render_text(&side, &side, &d, 0).len();
        n += serde_json::to_string(&d).map_or(0, |s| s.len());
    }
    // Export: both formats; the Chrome JSON of any input parses (exact escaping, no stray bytes).
    for format in [gpufl_export::Format::Perfetto, gpufl_export::Format::Chrome] {
        let opts = gpufl_export::Options {
            format,
            ..gpufl_export::Options::default()
        };
        let mut out = Vec::new();
        if gpufl_export::export(&[dir.to_path_buf()], &mut out, &opts).is_ok()
            && format == gpufl_export::Format::Chrome
        {
            assert!(
                serde_json::from_slice::<serde::de::IgnoredAny>(&out).is_ok(),
                "the Chrome export is not JSON"
            );
        }
        n += out.len();
    }
    for raw in [false, true] {
        let args = crate::dump::DumpArgs {
            session: dir.to_path_buf(),
            r#type: Vec::new(),
            raw,
            limit: None,
            all_frames: false,
        };
        let mut printed = 0;
        let _ = crate::dump::dump_dir(dir, &args, &mut printed, &mut |l| {
            n += l.len();
            Ok(())
        });
    }
    n
}

/// Milliseconds since the first call in this process, at least 1 (0 marks no input running).
fn now_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Runs inputs until the time is up; panics listing the seeds of inputs that panicked.
fn fuzz_for(secs: u64, first_seed: u64, max_inputs: Option<u64>) {
    // One run at a time: runs share the process's temporary directory (each removes it first)
    // and the counting allocator's and watchdog's globals, so two tests fuzzing at once rewrote
    // each other's inputs under them.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let corpus = corpus();
    assert!(!corpus.is_empty(), "no testdata sessions");
    let tmp = std::env::temp_dir().join(format!("gpufl-fuzz-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let t0 = Instant::now();
    // The watchdog, one for the process (runs of several tests share it; each run's own clock
    // made an earlier run's watchdog blame the next run's inputs): an input running over TIME_CAP
    // ends the process with its seed.
    static WATCHDOG: std::sync::Once = std::sync::Once::new();
    WATCHDOG.call_once(|| {
        std::thread::spawn(|| loop {
            std::thread::sleep(Duration::from_millis(100));
            let started = STARTED_MS.load(Ordering::Relaxed);
            if started > 0 && now_ms().saturating_sub(started) > TIME_CAP.as_millis() as u64 {
                die(if cfg!(debug_assertions) {
                    b"ran over 60 s (unoptimized build)"
                } else {
                    b"ran over 10 s"
                });
            }
        });
    });
    let keep = knobs::keep();
    let verbose = max_inputs.is_some() || knobs::verbose();
    let (mut inputs, mut panics, mut peak_max, mut slowest) =
        (0u64, Vec::new(), 0usize, (0u128, 0u64));
    let mut hist: std::collections::BTreeMap<&'static str, u64> = Default::default();
    let mut seed = first_seed;
    while t0.elapsed() < Duration::from_secs(secs) && max_inputs.is_none_or(|m| inputs < m) {
        let input = make_input(seed, &corpus);
        for h in &input.how {
            *hist.entry(h).or_default() += 1;
        }
        let dir = tmp.join("s");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in &input.files {
            std::fs::write(dir.join(name), bytes).unwrap();
            if let Some(k) = &keep {
                let d = k.join(format!("seed-{seed}"));
                let _ = std::fs::create_dir_all(&d);
                let _ = std::fs::write(d.join(name), bytes);
            }
        }
        if verbose {
            let sizes: Vec<String> = input
                .files
                .iter()
                .map(|(n, b)| format!("{n} {} B", b.len()))
                .collect();
            println!("fuzz: seed {seed}: {:?} -> {sizes:?}", input.how);
        }
        drop(input);
        SEED.store(seed, Ordering::Relaxed);
        let base = LIVE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let started = Instant::now();
        STARTED_MS.store(now_ms(), Ordering::Relaxed);
        ARMED.store(true, Ordering::Relaxed);
        let r = std::panic::catch_unwind(|| run_cli_paths(&dir));
        ARMED.store(false, Ordering::Relaxed);
        STARTED_MS.store(0, Ordering::Relaxed);
        let took = started.elapsed().as_millis();
        if verbose {
            println!("fuzz: seed {seed}: {took} ms");
        }
        if took > slowest.0 {
            slowest = (took, seed);
        }
        peak_max = peak_max.max(PEAK.load(Ordering::Relaxed).saturating_sub(base));
        if r.is_err() {
            panics.push(seed);
        }
        inputs += 1;
        seed = seed.wrapping_add(1);
    }
    let _ = std::fs::remove_dir_all(&tmp);
    println!(
        "fuzz: {inputs} inputs in {:.1} s from seed {first_seed}: {} panic(s), peak heap of one input {} MiB (cap {} MiB), slowest {} ms (seed {}, cap {} s)",
        t0.elapsed().as_secs_f64(),
        panics.len(),
        peak_max >> 20,
        MEM_CAP >> 20,
        slowest.0,
        slowest.1,
        TIME_CAP.as_secs()
    );
    println!("fuzz: mutations applied: {hist:?}");
    assert!(
        panics.is_empty(),
        "inputs that panicked (seeds): {panics:?}; replay one with GPUFL_FUZZ_SEED=<seed> GPUFL_FUZZ_INPUTS=1"
    );
}

#[test]
fn fuzz() {
    let secs = knobs::secs().unwrap_or(15);
    let seed = knobs::seed().unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
            .wrapping_mul(1_000_003)
    });
    println!("fuzz: GPUFL_FUZZ_SEED={seed} GPUFL_FUZZ_SECS={secs}");
    fuzz_for(secs, seed, knobs::inputs());
}

/// Inputs the random runs found panicking, replayed on every run: 1795605398800036 (odd numbers
/// and duplicated lines: kernel and sync durations near u64::MAX overflowed sums in
/// `launch-bound`, the kernel table, attribution and `info`'s totals in debug builds),
/// 1795605804801381 (the same in `gpufl diff`'s per-line copy bytes) and 1795663326973854
/// (the attribution's total of its shares, with the mutation set of 2026-11-26).
#[test]
fn former_findings_stay_fixed() {
    // Each seed names one input (GPUFL_FUZZ_INPUTS=1 with that seed).
    for seed in [
        1_795_605_398_800_036u64,
        1_795_605_804_801_381,
        1_795_663_326_973_854,
        1_795_705_044_098_979,
    ] {
        fuzz_for(60, seed, Some(1));
    }
}

#[test]
fn inputs_are_reproducible_from_their_seed() {
    let corpus = corpus();
    for seed in [1u64, 2, 99, u64::MAX] {
        let (a, b) = (make_input(seed, &corpus), make_input(seed, &corpus));
        assert_eq!(a.files, b.files);
        assert_eq!(a.how, b.how);
    }
}

#[test]
fn rle_frames_decode_to_what_they_claim() {
    for declare in [false, true] {
        let f = rle_frame(b'z', 300_000, declare);
        let d = zstd::decode_all(&f[..]).unwrap();
        assert_eq!(d.len(), 300_000);
        assert!(d.iter().all(|&c| c == b'z'));
    }
}
