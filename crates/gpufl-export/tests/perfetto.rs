//! The Perfetto export decoded with a small protobuf decoder written here, against the field
//! numbers of Perfetto's published `.proto` files (google/perfetto, protos/perfetto/trace/…):
//!
//! - trace.proto `Trace`: `repeated TracePacket packet = 1`
//! - trace_packet.proto `TracePacket`: `timestamp = 8`, `trusted_packet_sequence_id = 10`,
//!   `track_event = 11`, `interned_data = 12`, `sequence_flags = 13` (SEQ_INCREMENTAL_STATE_CLEARED
//!   = 1, SEQ_NEEDS_INCREMENTAL_STATE = 2), `track_descriptor = 60`
//! - track_event.proto `TrackEvent`: `category_iids = 3`, `debug_annotations = 4`, `type = 9`
//!   (TYPE_SLICE_BEGIN 1, TYPE_SLICE_END 2, TYPE_INSTANT 3, TYPE_COUNTER 4), `name_iid = 10`,
//!   `track_uuid = 11`, `double_counter_value = 44`, `repeated fixed64 flow_ids = 47`,
//!   `repeated fixed64 terminating_flow_ids = 48`
//! - debug_annotation.proto `DebugAnnotation`: `name_iid = 1`, `uint_value = 3`,
//!   `double_value = 5`, `string_value = 6`
//! - interned_data.proto `InternedData`: `event_categories = 1`, `event_names = 2`,
//!   `debug_annotation_names = 3`; `EventCategory` / `EventName` / `DebugAnnotationName`:
//!   `iid = 1`, `name = 2`
//! - track_descriptor.proto `TrackDescriptor`: `uuid = 1`, `name = 2`, `process = 3`,
//!   `thread = 4`, `parent_uuid = 5`, `counter = 8`; process_descriptor.proto: `pid = 1`,
//!   `process_name = 6`; thread_descriptor.proto: `pid = 1`, `tid = 2`, `thread_name = 5`;
//!   counter_descriptor.proto: `unit = 3` (UNIT_SIZE_BYTES 3)
//!
//! Slices are rebuilt as Perfetto's trace processor does: events sorted by timestamp (stably),
//! a BEGIN opens a slice on its track, an END closes the innermost open one.

mod common;

use common::*;
use gpufl_export::{export, Format, Options};
use std::collections::{BTreeMap, HashMap};

#[derive(Debug)]
enum V<'a> {
    Int(u64),
    Fixed(u64),
    Bytes(&'a [u8]),
}

fn varint(b: &mut &[u8]) -> u64 {
    let mut v = 0u64;
    for shift in (0..70).step_by(7) {
        let (&c, rest) = b.split_first().expect("varint cut");
        *b = rest;
        v |= ((c & 0x7f) as u64) << shift;
        if c < 0x80 {
            return v;
        }
    }
    panic!("varint too long")
}

fn fields(mut b: &[u8]) -> Vec<(u32, V<'_>)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b);
        let (field, wire) = ((key >> 3) as u32, key & 7);
        let v = match wire {
            0 => V::Int(varint(&mut b)),
            1 => {
                let (x, rest) = b.split_at(8);
                b = rest;
                V::Fixed(u64::from_le_bytes(x.try_into().unwrap()))
            }
            2 => {
                let n = varint(&mut b) as usize;
                let (x, rest) = b.split_at(n);
                b = rest;
                V::Bytes(x)
            }
            w => panic!("unexpected wire type {w} for field {field}"),
        };
        out.push((field, v));
    }
    out
}

fn int(v: &V) -> u64 {
    match v {
        V::Int(x) => *x,
        other => panic!("expected a varint, got {other:?}"),
    }
}
fn bytes<'a>(v: &V<'a>) -> &'a [u8] {
    match v {
        V::Bytes(x) => x,
        other => panic!("expected bytes, got {other:?}"),
    }
}
fn string(v: &V) -> String {
    String::from_utf8(bytes(v).to_vec()).expect("utf-8")
}

#[derive(Debug, Default, Clone)]
struct TrackD {
    name: Option<String>,
    parent: Option<u64>,
    process: Option<(u64, String)>,
    thread: Option<(u64, u64, String)>,
    counter: Option<Option<u64>>,
}

#[derive(Debug, Clone, PartialEq)]
enum Ann {
    U(u64),
    F(f64),
    S(String),
}

#[derive(Debug, Clone)]
struct Ev {
    ts: u64,
    ty: u64,
    track: u64,
    name: Option<String>,
    cat: Option<String>,
    args: BTreeMap<String, Ann>,
    flows: Vec<u64>,
    terms: Vec<u64>,
    value: Option<f64>,
}

#[derive(Debug, Clone)]
struct Slice {
    ev: Ev,
    dur: u64,
}

#[derive(Default)]
struct Decoded {
    tracks: HashMap<u64, TrackD>,
    slices: Vec<Slice>,
    instants: Vec<Ev>,
    counters: Vec<Ev>,
    unmatched_ends: usize,
    unclosed: usize,
}

fn decode(trace: &[u8]) -> Decoded {
    let mut d = Decoded::default();
    let (mut names, mut cats, mut anns) = (HashMap::new(), HashMap::new(), HashMap::new());
    let mut cleared = false;
    let mut events = Vec::new();
    for (field, v) in fields(trace) {
        assert_eq!(field, 1, "Trace has only packets");
        let mut ev: Option<Ev> = None;
        let mut ts = None;
        for (f, v) in fields(bytes(&v)) {
            match f {
                8 => ts = Some(int(&v)),
                10 => assert_eq!(int(&v), 1, "one sequence"),
                13 => {
                    let flags = int(&v);
                    if flags & 1 != 0 {
                        cleared = true;
                        names.clear();
                        cats.clear();
                        anns.clear();
                    }
                    if flags & 2 != 0 {
                        assert!(
                            cleared,
                            "a packet needs incremental state before it was cleared"
                        );
                    }
                }
                12 => {
                    for (kind, e) in fields(bytes(&v)) {
                        let (mut iid, mut name) = (0, String::new());
                        for (f, v) in fields(bytes(&e)) {
                            match f {
                                1 => iid = int(&v),
                                2 => name = string(&v),
                                _ => panic!("interned entry field {f}"),
                            }
                        }
                        let table = match kind {
                            1 => &mut cats,
                            2 => &mut names,
                            3 => &mut anns,
                            _ => panic!("interned data field {kind}"),
                        };
                        assert!(table.insert(iid, name).is_none(), "iid {iid} defined twice");
                    }
                }
                60 => {
                    let mut t = TrackD::default();
                    let mut uuid = None;
                    for (f, v) in fields(bytes(&v)) {
                        match f {
                            1 => uuid = Some(int(&v)),
                            2 => t.name = Some(string(&v)),
                            5 => t.parent = Some(int(&v)),
                            3 => {
                                let (mut pid, mut name) = (0, String::new());
                                for (f, v) in fields(bytes(&v)) {
                                    match f {
                                        1 => pid = int(&v),
                                        6 => name = string(&v),
                                        _ => panic!("process field {f}"),
                                    }
                                }
                                t.process = Some((pid, name));
                            }
                            4 => {
                                let (mut pid, mut tid, mut name) = (0, 0, String::new());
                                for (f, v) in fields(bytes(&v)) {
                                    match f {
                                        1 => pid = int(&v),
                                        2 => tid = int(&v),
                                        5 => name = string(&v),
                                        _ => panic!("thread field {f}"),
                                    }
                                }
                                t.thread = Some((pid, tid, name));
                            }
                            8 => {
                                let mut unit = None;
                                for (f, v) in fields(bytes(&v)) {
                                    assert_eq!(f, 3, "counter descriptor field");
                                    unit = Some(int(&v));
                                }
                                t.counter = Some(unit);
                            }
                            _ => panic!("track descriptor field {f}"),
                        }
                    }
                    let uuid = uuid.expect("track uuid");
                    assert!(d.tracks.insert(uuid, t).is_none(), "track {uuid} twice");
                }
                11 => {
                    let mut e = Ev {
                        ts: 0,
                        ty: 0,
                        track: 0,
                        name: None,
                        cat: None,
                        args: BTreeMap::new(),
                        flows: vec![],
                        terms: vec![],
                        value: None,
                    };
                    for (f, v) in fields(bytes(&v)) {
                        match f {
                            9 => e.ty = int(&v),
                            11 => e.track = int(&v),
                            3 => e.cat = Some(cats[&int(&v)].clone()),
                            10 => e.name = Some(names[&int(&v)].clone()),
                            44 => match v {
                                V::Fixed(x) => e.value = Some(f64::from_bits(x)),
                                _ => panic!("double"),
                            },
                            47 | 48 => match v {
                                V::Fixed(x) => {
                                    if f == 47 {
                                        e.flows.push(x)
                                    } else {
                                        e.terms.push(x)
                                    }
                                }
                                _ => panic!("flow ids are fixed64"),
                            },
                            4 => {
                                let (mut k, mut val) = (String::new(), None);
                                for (f, v) in fields(bytes(&v)) {
                                    match (f, &v) {
                                        (1, _) => k = anns[&int(&v)].clone(),
                                        (3, _) => val = Some(Ann::U(int(&v))),
                                        (5, V::Fixed(x)) => val = Some(Ann::F(f64::from_bits(*x))),
                                        (6, _) => val = Some(Ann::S(string(&v))),
                                        _ => panic!("debug annotation field {f}"),
                                    }
                                }
                                e.args.insert(k, val.expect("annotation value"));
                            }
                            _ => panic!("track event field {f}"),
                        }
                    }
                    ev = Some(e);
                }
                _ => panic!("packet field {f}"),
            }
        }
        if let Some(mut e) = ev {
            e.ts = ts.expect("event timestamp");
            events.push(e);
        }
    }
    events.sort_by_key(|e| e.ts);
    let mut open: HashMap<u64, Vec<Ev>> = HashMap::new();
    for e in events {
        assert!(
            d.tracks.contains_key(&e.track),
            "event on an undescribed track"
        );
        match e.ty {
            1 => open.entry(e.track).or_default().push(e),
            2 => match open.get_mut(&e.track).and_then(|s| s.pop()) {
                Some(b) => d.slices.push(Slice {
                    dur: e.ts - b.ts,
                    ev: b,
                }),
                None => d.unmatched_ends += 1,
            },
            3 => d.instants.push(e),
            4 => d.counters.push(e),
            t => panic!("event type {t}"),
        }
    }
    d.unclosed = open.values().map(|v| v.len()).sum();
    d
}

fn perfetto(dirs: &[std::path::PathBuf]) -> Vec<u8> {
    let mut out = Vec::new();
    export(dirs, &mut out, &Options::default()).unwrap();
    out
}

/// (dev, stream) of a GPU stream track.
fn stream_of(t: &TrackD) -> Option<(u32, u32)> {
    let n = t.name.as_deref()?;
    let rest = n.strip_prefix("GPU ")?;
    let dev = rest.split(' ').next()?.parse().ok()?;
    let stream = n.rsplit("stream ").next()?.parse().ok()?;
    Some((dev, stream))
}

fn check_session(d: &Decoded, dir: &std::path::Path, pid: u64) {
    let e = expected(dir);
    let proc_uuid = d
        .tracks
        .iter()
        .find(|(_, t)| t.process.as_ref().is_some_and(|p| p.0 == pid))
        .map(|(u, _)| *u)
        .expect("process track");
    let mine = |track: u64| {
        let t = &d.tracks[&track];
        t.parent == Some(proc_uuid) || t.thread.as_ref().is_some_and(|th| th.0 == pid)
    };
    // Every kernel, copy and memset once, on its GPU and stream's track, with its time.
    let got: Vec<GpuWork> = d
        .slices
        .iter()
        .filter(|s| mine(s.ev.track))
        .filter_map(|s| {
            let cat = match s.ev.cat.as_deref()? {
                "kernel" => "kernel",
                "memcpy" => "memcpy",
                "memset" => "memset",
                _ => return None,
            };
            let (dev, stream) = stream_of(&d.tracks[&s.ev.track]).expect("a stream track");
            Some((dev, stream, cat, s.ev.name.clone()?, s.ev.ts, s.dur))
        })
        .collect();
    assert_eq!(counts(got), counts(e.gpu.clone()), "{}", dir.display());
    // Syncs with their stack.
    let syncs: Vec<&Slice> = d
        .slices
        .iter()
        .filter(|s| mine(s.ev.track) && s.ev.cat.as_deref() == Some("sync"))
        .collect();
    assert_eq!(syncs.len(), e.syncs);
    let with_stack = syncs
        .iter()
        .filter(|s| matches!(s.ev.args.get("stack"), Some(Ann::S(st)) if !st.is_empty()))
        .count();
    assert_eq!(with_stack, e.syncs_with_stack);
    for s in &syncs {
        assert!(
            d.tracks[&s.ev.track].thread.is_some(),
            "syncs on thread tracks"
        );
    }
    // Telemetry as counters, on counter tracks.
    let ctr: Vec<&Ev> = d.counters.iter().filter(|c| mine(c.track)).collect();
    assert_eq!(ctr.len(), e.telemetry_values);
    for c in &ctr {
        assert!(d.tracks[&c.track].counter.is_some());
        assert!(c.value.is_some());
    }
    // Insights as instants, with their figures.
    let ins: Vec<&Ev> = d
        .instants
        .iter()
        .filter(|i| mine(i.track) && i.cat.as_deref() == Some("insight"))
        .collect();
    assert_eq!(ins.len(), insight_count(dir), "{}", dir.display());
    for i in &ins {
        assert!(i.args.contains_key("rule") && i.args.contains_key("fix"));
    }
    // Scopes: every open a slice.
    let scopes = d
        .slices
        .iter()
        .filter(|s| mine(s.ev.track) && s.ev.cat.as_deref() == Some("scope"))
        .count();
    assert_eq!(scopes, e.scope_opens);
}

fn check_flows(d: &Decoded) {
    let mut src: HashMap<u64, Vec<&Slice>> = HashMap::new();
    let mut dst: HashMap<u64, Vec<&Slice>> = HashMap::new();
    for s in &d.slices {
        for &f in &s.ev.flows {
            src.entry(f).or_default().push(s);
        }
        for &f in &s.ev.terms {
            dst.entry(f).or_default().push(s);
        }
    }
    for i in &d.instants {
        assert!(
            i.flows.is_empty() && i.terms.is_empty(),
            "flows on slices only"
        );
    }
    assert_eq!(
        src.keys().collect::<std::collections::BTreeSet<_>>(),
        dst.keys().collect(),
        "every flow has both ends"
    );
    for (id, s) in &src {
        assert_eq!(s.len(), 1, "flow {id}: one source");
        assert_eq!(dst[id].len(), 1, "flow {id}: one target");
        let (a, b) = (s[0], dst[id][0]);
        assert!(matches!(a.ev.cat.as_deref(), Some("api" | "callsite")));
        assert!(matches!(
            b.ev.cat.as_deref(),
            Some("kernel" | "memcpy" | "memset")
        ));
        assert_eq!(
            a.ev.args.get("corr"),
            b.ev.args.get("corr"),
            "flow {id} joins one correlation id"
        );
        assert!(d.tracks[&a.ev.track].thread.is_some());
        assert!(stream_of(&d.tracks[&b.ev.track]).is_some());
    }
}

/// Hostcalls are slices on their thread's track (name, time, duration as recorded); host samples
/// are slices on a "host samples" track under their thread's, each ending at its sample, with its
/// state, and named by the state (or the CUDA call) and the innermost user line.
#[test]
fn host_calls_and_samples_are_on_their_threads() {
    for name in [
        "malloc_free_loop-613-20261127T204121Z",
        "pytorch_empty_cache-759-20261127T204130Z",
    ] {
        let dir = testdata(name);
        let e = expected(&dir);
        assert!(!e.hostcalls.is_empty() && !e.hsamples.is_empty(), "{name}");
        let d = decode(&perfetto(std::slice::from_ref(&dir)));
        assert_eq!((d.unmatched_ends, d.unclosed), (0, 0), "{name}");
        let tid_of = |track: u64| d.tracks[&track].thread.as_ref().map(|t| t.1);
        let calls: Vec<(u64, String, u64, u64)> = d
            .slices
            .iter()
            .filter(|s| s.ev.cat.as_deref() == Some("hostcall"))
            .map(|s| {
                let tid = tid_of(s.ev.track).expect("a hostcall on a thread track");
                (tid, s.ev.name.clone().unwrap(), s.ev.ts, s.dur)
            })
            .collect();
        assert_eq!(counts(calls), counts(e.hostcalls.clone()), "{name}");
        let mut samples = Vec::new();
        for s in d
            .slices
            .iter()
            .filter(|s| s.ev.cat.as_deref() == Some("hsample"))
        {
            let t = &d.tracks[&s.ev.track];
            let tid = tid_of(t.parent.expect("under a thread")).expect("parent is a thread track");
            assert_eq!(
                t.name.as_deref(),
                Some(format!("host samples · thread {tid}").as_str())
            );
            let Some(Ann::U(period)) = s.ev.args.get("period_ns") else {
                panic!("period arg")
            };
            assert!(s.dur <= *period, "at most the sample's period");
            let Some(Ann::S(state)) = s.ev.args.get("state") else {
                panic!("state arg")
            };
            let call = match s.ev.args.get("call") {
                Some(Ann::S(c)) => Some(c.clone()),
                _ => None,
            };
            let n = s.ev.name.clone().unwrap();
            match &call {
                Some(c) => assert!(n.starts_with(&format!("in {c}")), "{n}"),
                None => assert!(!n.is_empty()),
            }
            samples.push((tid, s.ev.ts + s.dur, state.clone(), call));
        }
        assert_eq!(counts(samples), counts(e.hsamples.clone()), "{name}");
    }
    // The C++ loop's thread has no sampled stack (no Python): its samples say the call; the
    // PyTorch loop's name the user's line.
    let d = decode(&perfetto(&[testdata(
        "malloc_free_loop-613-20261127T204121Z",
    )]));
    let names: Vec<String> = d
        .slices
        .iter()
        .filter(|s| s.ev.cat.as_deref() == Some("hsample"))
        .filter_map(|s| s.ev.name.clone())
        .collect();
    assert!(names.iter().any(|n| n == "in cudaFree"), "{names:?}");
    let d = decode(&perfetto(&[testdata(
        "pytorch_empty_cache-759-20261127T204130Z",
    )]));
    let names: Vec<String> = d
        .slices
        .iter()
        .filter(|s| s.ev.cat.as_deref() == Some("hsample"))
        .filter_map(|s| s.ev.name.clone())
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("in cudaFree @ pytorch_empty_cache.py:")),
        "{names:?}"
    );
}

#[test]
fn testdata_sessions_decode_against_perfettos_protos() {
    for dir in sessions() {
        let d = decode(&perfetto(std::slice::from_ref(&dir)));
        assert_eq!(d.unmatched_ends, 0, "{}", dir.display());
        assert_eq!(d.unclosed, 0, "{}", dir.display());
        check_session(&d, &dir, expected(&dir).pid as u64);
        check_flows(&d);
    }
}

#[test]
fn flows_link_launches_of_every_shape() {
    let dir = synthetic();
    let d = decode(&perfetto(std::slice::from_ref(&dir)));
    check_flows(&d);
    let flows: BTreeMap<u64, (&str, &str)> = d
        .slices
        .iter()
        .flat_map(|s| s.ev.flows.iter().map(move |&f| (f, s)))
        .map(|(f, s)| {
            let t = d.slices.iter().find(|t| t.ev.terms.contains(&f)).unwrap();
            (
                f & 0xffff_ffff,
                (s.ev.cat.as_deref().unwrap(), t.ev.cat.as_deref().unwrap()),
            )
        })
        .collect();
    // corr 1: api (not its call site) → kernel; 2: call site → kernel; 3: no GPU work;
    // 4: graph launch, one arrow; 5: no launch record; 6: api → copy; 7: no launch record.
    assert_eq!(
        flows,
        BTreeMap::from([
            (1, ("api", "kernel")),
            (2, ("callsite", "kernel")),
            (4, ("api", "kernel")),
            (6, ("api", "memcpy")),
        ])
    );
    // Hostile names arrive exactly.
    assert!(d
        .slices
        .iter()
        .any(|s| s.ev.name.as_deref() == Some("void k<\"q\">(int)\n\t\u{0}\u{202e}evil")));
    // The scope left open ends at the session's last time; memory in bytes.
    let open = d
        .slices
        .iter()
        .find(|s| {
            s.ev.name.as_deref() == Some("step \"1\"") && s.ev.cat.as_deref() == Some("scope")
        })
        .unwrap();
    assert_eq!(open.ev.args.get("unclosed"), Some(&Ann::U(1)));
    assert!(d
        .tracks
        .values()
        .any(|t| t.counter == Some(Some(3)) && t.name.as_deref().unwrap().contains("memory used")));
}

#[test]
fn several_sessions_in_one_file_one_process_each() {
    let dirs = vec![
        testdata("pytorch_train_sync-1304"),
        testdata("nvtx_ranges"),
        synthetic(),
        // The same session twice: its pid is taken, so the second copy gets a synthetic one.
        testdata("nvtx_ranges"),
    ];
    let d = decode(&perfetto(&dirs));
    let procs: Vec<u64> = d
        .tracks
        .values()
        .filter_map(|t| t.process.as_ref().map(|p| p.0))
        .collect();
    assert_eq!(procs.len(), 4);
    assert_eq!(counts(procs.iter()).len(), 4, "distinct pids: {procs:?}");
    check_flows(&d);
    for dir in &dirs[..3] {
        check_session(&d, dir, expected(dir).pid as u64);
    }
    // Sessions line up on the wall clock: every timestamp is Unix ns of 2026 or so.
    for s in &d.slices {
        assert!(s.ev.ts > 1_700_000_000_000_000_000, "{}", s.ev.ts);
    }
}

#[test]
fn a_bad_session_is_a_clear_error() {
    let tmp = std::env::temp_dir().join(format!("gpufl-export-bad-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let err = gpufl_export::find_sessions(std::slice::from_ref(&tmp)).unwrap_err();
    assert!(
        err.to_string().contains("is not a gpufl session directory"),
        "{err}"
    );
    std::fs::write(tmp.join("trace-0000.ndjson.zst"), b"garbage").unwrap();
    // A session whose only file is not a trace: exported empty, the reader's warning in the notes.
    let mut out = Vec::new();
    let s = export(
        std::slice::from_ref(&tmp),
        &mut out,
        &Options {
            format: Format::Perfetto,
            ..Options::default()
        },
    )
    .unwrap();
    assert!(
        s.sessions[0]
            .notes
            .iter()
            .any(|n| n.contains("not a gpufl trace")),
        "{:?}",
        s.sessions[0].notes
    );
    decode(&out);
    std::fs::remove_dir_all(&tmp).ok();
}
