//! Chrome's JSON trace event format (the "Trace Event Format": `{"traceEvents": [...]}`), written
//! as it goes. Times are µs (`ts`, `dur`) relative to a base (the earliest session start, Unix ns,
//! kept in `otherData.base_unix_ns`), written with three decimals from integer ns, so they are
//! exact in the file and stay exact in a double for ~100 days after the base (absolute Unix µs
//! would not: 2^53 ns is 104 days). Slices are complete events (`X`), instants `i`, counters `C`,
//! track names `M`, flows `s` / `f` (with `bp: "e"`, binding to the enclosing slice). Strings
//! from the trace are escaped exactly (quotes, backslashes, every control character).

use crate::sink::{Arg, Event, Metric, SessionMeta, Sink, Track};
use std::collections::HashMap;
use std::io::{self, BufWriter, Write};

/// First synthetic thread id (GPU streams, ranges, insights): above Linux's pid_max (2^22).
pub const SYNTHETIC_TID: u64 = 0x4000_0000;

/// `s` as a JSON string literal, exact.
pub fn escape(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let b = s.as_bytes();
    let mut start = 0;
    for (i, &c) in b.iter().enumerate() {
        let rep: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&b[start..i]);
        if rep.is_empty() {
            out.extend_from_slice(format!("\\u{:04x}", c).as_bytes());
        } else {
            out.extend_from_slice(rep);
        }
        start = i + 1;
    }
    out.extend_from_slice(&b[start..]);
    out.push(b'"');
}

/// ns as µs with three decimals, exact.
fn us(out: &mut Vec<u8>, ns: i128) {
    if ns < 0 {
        out.push(b'-');
    }
    let a = ns.unsigned_abs();
    write!(out, "{}.{:03}", a / 1000, a % 1000).ok();
}

fn number(out: &mut Vec<u8>, x: f64) {
    if x.is_finite() {
        write!(out, "{x}").ok();
    } else {
        out.extend_from_slice(b"null");
    }
}

struct Session {
    meta: SessionMeta,
    next_tid: u64,
}

/// The Chrome JSON writer.
pub struct Writer<W: Write> {
    out: BufWriter<W>,
    buf: Vec<u8>,
    base: u64,
    first: bool,
    sessions: Vec<Session>,
    tids: HashMap<(u32, Track), u64>,
}

impl<W: Write> Writer<W> {
    pub fn new(out: W, base: u64) -> io::Result<Self> {
        let mut w = Writer {
            out: BufWriter::with_capacity(1 << 20, out),
            buf: Vec::with_capacity(4096),
            base,
            first: true,
            sessions: Vec::new(),
            tids: HashMap::new(),
        };
        write!(
            w.out,
            "{{\"displayTimeUnit\":\"ns\",\"otherData\":{{\"producer\":\"gpufl export\",\"base_unix_ns\":\"{base}\"}},\"traceEvents\":["
        )?;
        Ok(w)
    }

    /// Start one event object in `buf` (with the separator).
    fn open(&mut self) {
        self.buf.clear();
        if !self.first {
            self.buf.extend_from_slice(b",\n");
        } else {
            self.buf.push(b'\n');
        }
        self.first = false;
        self.buf.push(b'{');
    }

    fn close(&mut self) -> io::Result<()> {
        self.buf.push(b'}');
        self.out.write_all(&self.buf)
    }

    fn ts(&mut self, key: &str, ns: u64) {
        write!(self.buf, ",\"{key}\":").ok();
        us(&mut self.buf, ns as i128 - self.base as i128);
    }

    fn meta(&mut self, name: &str, pid: u32, tid: u64, key: &str, val: MetaVal) -> io::Result<()> {
        self.open();
        write!(
            self.buf,
            "\"ph\":\"M\",\"name\":\"{name}\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"{key}\":"
        )
        .ok();
        match val {
            MetaVal::S(s) => escape(&mut self.buf, &s),
            MetaVal::U(u) => write!(self.buf, "{u}").unwrap_or(()),
        }
        self.buf.push(b'}');
        self.close()
    }

    fn tid(&mut self, sess: u32, track: Track) -> io::Result<u64> {
        if let Some(&t) = self.tids.get(&(sess, track)) {
            return Ok(t);
        }
        let s = &mut self.sessions[sess as usize];
        let tid = match track {
            Track::Thread(t) => t,
            _ => {
                s.next_tid += 1;
                s.next_tid - 1
            }
        };
        let (pid, name) = (s.meta.pid, track.name(&s.meta));
        self.tids.insert((sess, track), tid);
        self.meta("thread_name", pid, tid, "name", MetaVal::S(name))?;
        self.meta(
            "thread_sort_index",
            pid,
            tid,
            "sort_index",
            MetaVal::U(track.rank() as u64),
        )?;
        Ok(tid)
    }

    fn args(&mut self, args: &[(&'static str, Arg)]) {
        self.buf.extend_from_slice(b",\"args\":{");
        for (i, (k, v)) in args.iter().enumerate() {
            if i > 0 {
                self.buf.push(b',');
            }
            escape(&mut self.buf, k);
            self.buf.push(b':');
            match v {
                Arg::U(u) => write!(self.buf, "{u}").unwrap_or(()),
                Arg::F(x) => number(&mut self.buf, *x),
                Arg::S(s) => escape(&mut self.buf, s),
                Arg::List(l) => {
                    self.buf.push(b'[');
                    for (j, s) in l.iter().enumerate() {
                        if j > 0 {
                            self.buf.push(b',');
                        }
                        escape(&mut self.buf, s);
                    }
                    self.buf.push(b']');
                }
            }
        }
        self.buf.push(b'}');
    }

    fn flow(&mut self, ph: &str, id: u64, pid: u32, tid: u64, ts: u64) -> io::Result<()> {
        self.open();
        write!(
            self.buf,
            "\"ph\":\"{ph}\",\"name\":\"launch\",\"cat\":\"flow\",\"id\":{id},\"pid\":{pid},\"tid\":{tid}"
        )
        .ok();
        if ph == "f" {
            self.buf.extend_from_slice(b",\"bp\":\"e\"");
        }
        self.ts("ts", ts);
        self.close()
    }
}

enum MetaVal {
    S(String),
    U(u64),
}

impl<W: Write> Sink for Writer<W> {
    fn session(&mut self, index: u32, meta: SessionMeta) -> io::Result<()> {
        let (pid, name) = (meta.pid, meta.name.clone());
        self.sessions.push(Session {
            meta,
            next_tid: SYNTHETIC_TID,
        });
        self.meta("process_name", pid, 0, "name", MetaVal::S(name))?;
        self.meta(
            "process_sort_index",
            pid,
            0,
            "sort_index",
            MetaVal::U(index as u64),
        )
    }

    fn event(&mut self, sess: u32, e: &Event) -> io::Result<()> {
        let tid = self.tid(sess, e.track)?;
        let pid = self.sessions[sess as usize].meta.pid;
        self.open();
        let ph = if e.dur.is_some() { "X" } else { "i" };
        write!(self.buf, "\"ph\":\"{ph}\",\"name\":").ok();
        escape(&mut self.buf, e.name);
        write!(
            self.buf,
            ",\"cat\":\"{}\",\"pid\":{pid},\"tid\":{tid}",
            e.cat.name()
        )
        .ok();
        self.ts("ts", e.ts);
        match e.dur {
            Some(d) => {
                self.buf.extend_from_slice(b",\"dur\":");
                us(&mut self.buf, d as i128);
            }
            None => self.buf.extend_from_slice(b",\"s\":\"t\""),
        }
        self.args(e.args);
        self.close()?;
        if let Some(id) = e.flow_out {
            self.flow("s", id, pid, tid, e.ts)?;
        }
        if let Some(id) = e.flow_in {
            self.flow("f", id, pid, tid, e.ts)?;
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
        let pid = self.sessions[sess as usize].meta.pid;
        self.open();
        self.buf.extend_from_slice(b"\"ph\":\"C\",\"name\":");
        escape(&mut self.buf, &format!("GPU {dev} {}", metric.name()));
        write!(self.buf, ",\"pid\":{pid},\"tid\":0").ok();
        self.ts("ts", ts);
        self.buf.extend_from_slice(b",\"args\":{\"value\":");
        number(&mut self.buf, value);
        self.buf.push(b'}');
        self.close()
    }

    fn finish(&mut self) -> io::Result<()> {
        self.out.write_all(b"\n]}\n")?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_is_exact() {
        let nasty = "a\"b\\c\nd\re\tf\u{0}\u{1b}[31m\u{7f}\u{2028}é😀";
        let mut out = Vec::new();
        escape(&mut out, nasty);
        let back: String = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, nasty);
    }

    #[test]
    fn microseconds() {
        let mut b = Vec::new();
        us(&mut b, 1_234_567);
        b.push(b' ');
        us(&mut b, -5);
        assert_eq!(String::from_utf8(b).unwrap(), "1234.567 -0.005");
    }
}
