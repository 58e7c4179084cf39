//! Perfetto's protobuf trace, written by hand: a `Trace` is a sequence of `packet` fields (field 1,
//! length-delimited `TracePacket`s), so packets are encoded one at a time into a scratch buffer
//! and streamed out. Field numbers are those of Perfetto's published `.proto` files
//! (`protos/perfetto/trace/...`), cited per constant.
//!
//! One packet sequence (trusted_packet_sequence_id 1). Event names, categories and argument
//! names are interned (`InternedData`); the table is dropped and the sequence's incremental state
//! cleared again when it holds [`MAX_NAMES`] names or [`MAX_NAME_BYTES`] bytes, so memory stays
//! bounded. Slices are `TYPE_SLICE_BEGIN` + `TYPE_SLICE_END` pairs (Perfetto has no complete
//! event), instants `TYPE_INSTANT`, telemetry `TYPE_COUNTER` on counter tracks. Timestamps are
//! Unix ns (the trace clock converted through each file's header clock).

use crate::sink::{Arg, Cat, Event, Metric, SessionMeta, Sink, Track};
use std::collections::HashMap;
use std::io::{self, BufWriter, Write};

/// Interned names kept before the sequence's state is cleared.
pub const MAX_NAMES: usize = 65_536;
/// Bytes of interned names kept before the state is cleared.
pub const MAX_NAME_BYTES: usize = 32 << 20;

/// Protobuf wire encoding (varints, tags, length-delimited fields).
pub mod pb {
    pub const VARINT: u8 = 0;
    pub const I64: u8 = 1;
    pub const LEN: u8 = 2;

    pub fn varint(buf: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        buf.push(v as u8);
    }
    pub fn tag(buf: &mut Vec<u8>, field: u32, wire: u8) {
        varint(buf, ((field as u64) << 3) | wire as u64);
    }
    pub fn uint(buf: &mut Vec<u8>, field: u32, v: u64) {
        tag(buf, field, VARINT);
        varint(buf, v);
    }
    pub fn fixed64(buf: &mut Vec<u8>, field: u32, v: u64) {
        tag(buf, field, I64);
        buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn double(buf: &mut Vec<u8>, field: u32, v: f64) {
        tag(buf, field, I64);
        buf.extend_from_slice(&v.to_bits().to_le_bytes());
    }
    pub fn bytes(buf: &mut Vec<u8>, field: u32, b: &[u8]) {
        tag(buf, field, LEN);
        varint(buf, b.len() as u64);
        buf.extend_from_slice(b);
    }
    pub fn string(buf: &mut Vec<u8>, field: u32, s: &str) {
        bytes(buf, field, s.as_bytes());
    }
    /// Open a nested message; [`end`] writes its length in front of it.
    pub fn begin(buf: &mut Vec<u8>, field: u32) -> usize {
        tag(buf, field, LEN);
        buf.len()
    }
    pub fn end(buf: &mut Vec<u8>, start: usize) {
        let mut len = Vec::with_capacity(5);
        varint(&mut len, (buf.len() - start) as u64);
        buf.splice(start..start, len);
    }
}

/// Field numbers, from Perfetto's `.proto` files.
pub mod f {
    /// trace.proto: `repeated TracePacket packet = 1;`
    pub const TRACE_PACKET: u32 = 1;

    // trace_packet.proto, message TracePacket
    pub const PKT_TIMESTAMP: u32 = 8; // optional uint64 timestamp = 8;
    pub const PKT_SEQUENCE_ID: u32 = 10; // uint32 trusted_packet_sequence_id = 10;
    pub const PKT_TRACK_EVENT: u32 = 11; // TrackEvent track_event = 11;
    pub const PKT_INTERNED_DATA: u32 = 12; // optional InternedData interned_data = 12;
    pub const PKT_SEQUENCE_FLAGS: u32 = 13; // optional uint32 sequence_flags = 13;
    pub const PKT_TRACK_DESCRIPTOR: u32 = 60; // TrackDescriptor track_descriptor = 60;
    pub const SEQ_INCREMENTAL_STATE_CLEARED: u64 = 1;
    pub const SEQ_NEEDS_INCREMENTAL_STATE: u64 = 2;

    // track_event.proto, message TrackEvent
    pub const TE_CATEGORY_IIDS: u32 = 3; // repeated uint64 category_iids = 3;
    pub const TE_DEBUG_ANNOTATIONS: u32 = 4; // repeated DebugAnnotation debug_annotations = 4;
    pub const TE_TYPE: u32 = 9; // optional Type type = 9;
    pub const TE_NAME_IID: u32 = 10; // uint64 name_iid = 10;
    pub const TE_TRACK_UUID: u32 = 11; // optional uint64 track_uuid = 11;
    pub const TE_DOUBLE_COUNTER_VALUE: u32 = 44; // double double_counter_value = 44;
    pub const TE_FLOW_IDS: u32 = 47; // repeated fixed64 flow_ids = 47;
    pub const TE_TERMINATING_FLOW_IDS: u32 = 48; // repeated fixed64 terminating_flow_ids = 48;
    pub const TYPE_SLICE_BEGIN: u64 = 1;
    pub const TYPE_SLICE_END: u64 = 2;
    pub const TYPE_INSTANT: u64 = 3;
    pub const TYPE_COUNTER: u64 = 4;

    // debug_annotation.proto, message DebugAnnotation
    pub const DA_NAME_IID: u32 = 1; // uint64 name_iid = 1;
    pub const DA_UINT: u32 = 3; // uint64 uint_value = 3;
    pub const DA_DOUBLE: u32 = 5; // double double_value = 5;
    pub const DA_STRING: u32 = 6; // string string_value = 6;

    // interned_data.proto, message InternedData
    pub const ID_EVENT_CATEGORIES: u32 = 1; // repeated EventCategory event_categories = 1;
    pub const ID_EVENT_NAMES: u32 = 2; // repeated EventName event_names = 2;
    pub const ID_DEBUG_ANNOTATION_NAMES: u32 = 3; // repeated DebugAnnotationName debug_annotation_names = 3;
                                                  // EventCategory, EventName, DebugAnnotationName: iid = 1, name = 2
    pub const INTERNED_IID: u32 = 1;
    pub const INTERNED_NAME: u32 = 2;

    // track_descriptor.proto, message TrackDescriptor
    pub const TD_UUID: u32 = 1; // optional uint64 uuid = 1;
    pub const TD_NAME: u32 = 2; // optional string name = 2;
    pub const TD_PROCESS: u32 = 3; // optional ProcessDescriptor process = 3;
    pub const TD_THREAD: u32 = 4; // optional ThreadDescriptor thread = 4;
    pub const TD_PARENT_UUID: u32 = 5; // optional uint64 parent_uuid = 5;
    pub const TD_COUNTER: u32 = 8; // optional CounterDescriptor counter = 8;

    // process_descriptor.proto, message ProcessDescriptor
    pub const PD_PID: u32 = 1; // optional int32 pid = 1;
    pub const PD_PROCESS_NAME: u32 = 6; // optional string process_name = 6;

    // thread_descriptor.proto, message ThreadDescriptor
    pub const THD_PID: u32 = 1; // optional int32 pid = 1;
    pub const THD_TID: u32 = 2; // optional int32 tid = 2;
    pub const THD_THREAD_NAME: u32 = 5; // optional string thread_name = 5;

    // counter_descriptor.proto, message CounterDescriptor
    pub const CD_UNIT: u32 = 3; // optional Unit unit = 3;
    pub const UNIT_SIZE_BYTES: u64 = 3;
}

use pb::*;

const SEQ: u64 = 1;

struct Session {
    meta: SessionMeta,
    uuid: u64,
}

/// The Perfetto writer.
pub struct Writer<W: Write> {
    out: BufWriter<W>,
    pkt: Vec<u8>,
    interned: Vec<u8>,
    names: HashMap<String, u64>,
    name_bytes: usize,
    ann: HashMap<&'static str, u64>,
    next_iid: u64,
    started: bool,
    sessions: Vec<Session>,
    tracks: HashMap<(u32, Track), u64>,
    counters: HashMap<(u32, u32, Metric), u64>,
    next_uuid: u64,
}

impl<W: Write> Writer<W> {
    pub fn new(out: W) -> Self {
        Writer {
            out: BufWriter::with_capacity(1 << 20, out),
            pkt: Vec::with_capacity(4096),
            interned: Vec::with_capacity(4096),
            names: HashMap::new(),
            name_bytes: 0,
            ann: HashMap::new(),
            next_iid: 1,
            started: false,
            sessions: Vec::new(),
            tracks: HashMap::new(),
            counters: HashMap::new(),
            next_uuid: 1,
        }
    }

    /// Write the packet in `self.pkt` as one `Trace.packet` field.
    fn flush_packet(&mut self) -> io::Result<()> {
        let mut head = Vec::with_capacity(8);
        tag(&mut head, f::TRACE_PACKET, LEN);
        varint(&mut head, self.pkt.len() as u64);
        self.out.write_all(&head)?;
        self.out.write_all(&self.pkt)?;
        self.pkt.clear();
        Ok(())
    }

    /// A packet clearing the sequence's incremental state and defining the categories; names
    /// are interned again from here on.
    fn clear_state(&mut self) -> io::Result<()> {
        self.names.clear();
        self.name_bytes = 0;
        self.ann.clear();
        self.next_iid = Cat::ALL.len() as u64 + 1;
        let p = &mut self.pkt;
        uint(p, f::PKT_SEQUENCE_ID, SEQ);
        uint(
            p,
            f::PKT_SEQUENCE_FLAGS,
            f::SEQ_INCREMENTAL_STATE_CLEARED | f::SEQ_NEEDS_INCREMENTAL_STATE,
        );
        let id = begin(p, f::PKT_INTERNED_DATA);
        for (i, c) in Cat::ALL.iter().enumerate() {
            let e = begin(p, f::ID_EVENT_CATEGORIES);
            uint(p, f::INTERNED_IID, i as u64 + 1);
            string(p, f::INTERNED_NAME, c.name());
            end(p, e);
        }
        end(p, id);
        self.started = true;
        self.flush_packet()
    }

    fn cat_iid(c: Cat) -> u64 {
        Cat::ALL.iter().position(|&x| x == c).unwrap_or(0) as u64 + 1
    }

    fn name_iid(&mut self, name: &str) -> io::Result<u64> {
        if let Some(&iid) = self.names.get(name) {
            return Ok(iid);
        }
        if self.names.len() >= MAX_NAMES || self.name_bytes + name.len() > MAX_NAME_BYTES {
            // Only between packets: `interned` is empty here (names are interned first).
            self.clear_state()?;
        }
        let iid = self.next_iid;
        self.next_iid += 1;
        self.names.insert(name.to_string(), iid);
        self.name_bytes += name.len();
        let e = begin(&mut self.interned, f::ID_EVENT_NAMES);
        uint(&mut self.interned, f::INTERNED_IID, iid);
        string(&mut self.interned, f::INTERNED_NAME, name);
        end(&mut self.interned, e);
        Ok(iid)
    }

    fn ann_iid(&mut self, name: &'static str) -> u64 {
        if let Some(&iid) = self.ann.get(name) {
            return iid;
        }
        let iid = self.next_iid;
        self.next_iid += 1;
        self.ann.insert(name, iid);
        let e = begin(&mut self.interned, f::ID_DEBUG_ANNOTATION_NAMES);
        uint(&mut self.interned, f::INTERNED_IID, iid);
        string(&mut self.interned, f::INTERNED_NAME, name);
        end(&mut self.interned, e);
        iid
    }

    fn descriptor(&mut self, build: impl FnOnce(&mut Vec<u8>)) -> io::Result<()> {
        let p = &mut self.pkt;
        uint(p, f::PKT_SEQUENCE_ID, SEQ);
        let td = begin(p, f::PKT_TRACK_DESCRIPTOR);
        build(p);
        end(p, td);
        self.flush_packet()
    }

    fn track(&mut self, sess: u32, track: Track) -> io::Result<u64> {
        if let Some(&u) = self.tracks.get(&(sess, track)) {
            return Ok(u);
        }
        let uuid = self.next_uuid;
        self.next_uuid += 1;
        self.tracks.insert((sess, track), uuid);
        // A thread's host samples go under its track (made first when the thread has no other).
        let thread_parent = match track {
            Track::HostSamples(tid) => Some(self.track(sess, Track::Thread(tid))?),
            _ => None,
        };
        let s = &self.sessions[sess as usize];
        let (pid, parent, name) = (
            s.meta.pid,
            thread_parent.unwrap_or(s.uuid),
            track.name(&s.meta),
        );
        self.descriptor(|p| {
            uint(p, f::TD_UUID, uuid);
            match track {
                Track::Thread(tid) => {
                    let t = begin(p, f::TD_THREAD);
                    uint(p, f::THD_PID, pid as u64);
                    uint(p, f::THD_TID, tid);
                    string(p, f::THD_THREAD_NAME, &name);
                    end(p, t);
                }
                _ => {
                    uint(p, f::TD_PARENT_UUID, parent);
                    string(p, f::TD_NAME, &name);
                }
            }
        })?;
        Ok(uuid)
    }

    fn ensure_started(&mut self) -> io::Result<()> {
        if !self.started {
            self.clear_state()?;
        }
        Ok(())
    }
}

impl<W: Write> Sink for Writer<W> {
    fn session(&mut self, index: u32, meta: SessionMeta) -> io::Result<()> {
        self.ensure_started()?;
        debug_assert_eq!(index as usize, self.sessions.len());
        let uuid = self.next_uuid;
        self.next_uuid += 1;
        let (pid, name) = (meta.pid, meta.name.clone());
        self.sessions.push(Session { meta, uuid });
        self.descriptor(|p| {
            uint(p, f::TD_UUID, uuid);
            let pd = begin(p, f::TD_PROCESS);
            uint(p, f::PD_PID, pid as u64);
            string(p, f::PD_PROCESS_NAME, &name);
            end(p, pd);
        })
    }

    fn event(&mut self, sess: u32, e: &Event) -> io::Result<()> {
        self.ensure_started()?;
        let track = self.track(sess, e.track)?;
        let name = self.name_iid(e.name)?;
        let anns: Vec<u64> = e.args.iter().map(|(k, _)| self.ann_iid(k)).collect();
        let p = &mut self.pkt;
        uint(p, f::PKT_TIMESTAMP, e.ts);
        uint(p, f::PKT_SEQUENCE_ID, SEQ);
        uint(p, f::PKT_SEQUENCE_FLAGS, f::SEQ_NEEDS_INCREMENTAL_STATE);
        if !self.interned.is_empty() {
            bytes(p, f::PKT_INTERNED_DATA, &self.interned);
            self.interned.clear();
        }
        let te = begin(p, f::PKT_TRACK_EVENT);
        let ty = if e.dur.is_some() {
            f::TYPE_SLICE_BEGIN
        } else {
            f::TYPE_INSTANT
        };
        uint(p, f::TE_TYPE, ty);
        uint(p, f::TE_TRACK_UUID, track);
        uint(p, f::TE_CATEGORY_IIDS, Self::cat_iid(e.cat));
        uint(p, f::TE_NAME_IID, name);
        for ((_, v), iid) in e.args.iter().zip(anns) {
            let da = begin(p, f::TE_DEBUG_ANNOTATIONS);
            uint(p, f::DA_NAME_IID, iid);
            match v {
                Arg::U(u) => uint(p, f::DA_UINT, *u),
                Arg::F(x) => double(p, f::DA_DOUBLE, *x),
                Arg::S(s) => string(p, f::DA_STRING, s),
                Arg::List(l) => string(p, f::DA_STRING, &l.join("\n")),
            }
            end(p, da);
        }
        if let Some(id) = e.flow_out {
            fixed64(p, f::TE_FLOW_IDS, id);
        }
        if let Some(id) = e.flow_in {
            fixed64(p, f::TE_TERMINATING_FLOW_IDS, id);
        }
        end(p, te);
        self.flush_packet()?;
        if let Some(d) = e.dur {
            let p = &mut self.pkt;
            uint(p, f::PKT_TIMESTAMP, e.ts.saturating_add(d));
            uint(p, f::PKT_SEQUENCE_ID, SEQ);
            uint(p, f::PKT_SEQUENCE_FLAGS, f::SEQ_NEEDS_INCREMENTAL_STATE);
            let te = begin(p, f::PKT_TRACK_EVENT);
            uint(p, f::TE_TYPE, f::TYPE_SLICE_END);
            uint(p, f::TE_TRACK_UUID, track);
            end(p, te);
            self.flush_packet()?;
        }
        Ok(())
    }

    fn counter(
        &mut self,
        sess: u32,
        dev: u32,
        metric: Metric,
        ts: u64,
        value: f64,
    ) -> io::Result<()> {
        self.ensure_started()?;
        let uuid = match self.counters.get(&(sess, dev, metric)) {
            Some(&u) => u,
            None => {
                let uuid = self.next_uuid;
                self.next_uuid += 1;
                self.counters.insert((sess, dev, metric), uuid);
                let parent = self.sessions[sess as usize].uuid;
                let name = format!("GPU {dev} {}", metric.name());
                self.descriptor(|p| {
                    uint(p, f::TD_UUID, uuid);
                    uint(p, f::TD_PARENT_UUID, parent);
                    string(p, f::TD_NAME, &name);
                    let cd = begin(p, f::TD_COUNTER);
                    if metric.is_bytes() {
                        uint(p, f::CD_UNIT, f::UNIT_SIZE_BYTES);
                    }
                    end(p, cd);
                })?;
                uuid
            }
        };
        let p = &mut self.pkt;
        uint(p, f::PKT_TIMESTAMP, ts);
        uint(p, f::PKT_SEQUENCE_ID, SEQ);
        uint(p, f::PKT_SEQUENCE_FLAGS, f::SEQ_NEEDS_INCREMENTAL_STATE);
        let te = begin(p, f::PKT_TRACK_EVENT);
        uint(p, f::TE_TYPE, f::TYPE_COUNTER);
        uint(p, f::TE_TRACK_UUID, uuid);
        double(p, f::TE_DOUBLE_COUNTER_VALUE, value);
        end(p, te);
        self.flush_packet()
    }

    fn finish(&mut self) -> io::Result<()> {
        self.ensure_started()?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::pb::*;

    #[test]
    fn varints() {
        let mut b = Vec::new();
        varint(&mut b, 0);
        varint(&mut b, 127);
        varint(&mut b, 128);
        varint(&mut b, 300);
        varint(&mut b, u64::MAX);
        assert_eq!(
            b,
            [0, 127, 0x80, 1, 0xac, 2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1]
        );
    }

    #[test]
    fn nested_lengths() {
        let mut b = Vec::new();
        let s = begin(&mut b, 1);
        bytes(&mut b, 2, &[7u8; 200]);
        end(&mut b, s);
        // tag 1/LEN, length 203 (2 bytes), tag 2/LEN, length 200 (2 bytes), payload
        assert_eq!(&b[..6], &[0x0a, 0xcb, 0x01, 0x12, 0xc8, 0x01]);
        assert_eq!(b.len(), 3 + 203);
    }
}
