//! A hand-written parser for the exact shape [`crate::TraceWriter`] gives `kernel` lines (keys in
//! schema order, no whitespace, integers only): kernels are most of a trace, and this is several
//! times faster than serde_json. Anything else — another key order, an extra or missing key,
//! whitespace, a number serde_json would read differently or refuse (leading zeros, `-0`, `+`,
//! fractions, exponents, overflow) — returns None, and the caller parses the line with serde_json,
//! so whatever this accepts is parsed exactly as serde_json would parse it.

use crate::ids::StrId;
use crate::records::Kernel;

struct Cur<'a> {
    b: &'a [u8],
    i: usize,
}

impl Cur<'_> {
    #[inline(always)]
    fn lit(&mut self, s: &[u8]) -> Option<()> {
        if self.b.get(self.i..)?.starts_with(s) {
            self.i += s.len();
            Some(())
        } else {
            None
        }
    }

    /// An unsigned JSON integer: `0` or `[1-9][0-9]*`, at most `max`.
    #[inline(always)]
    fn unsigned(&mut self, max: u64) -> Option<u64> {
        let b = self.b;
        let start = self.i;
        let mut i = start;
        let mut v: u64 = 0;
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
}

/// Parse a `kernel` line (without its newline) of the writer's exact shape; None otherwise.
pub(crate) fn kernel(line: &[u8]) -> Option<Kernel> {
    let mut c = Cur { b: line, i: 0 };
    c.lit(b"{\"t\":\"kernel\",\"name\":")?;
    let name = StrId(c.u32()?);
    c.lit(b",\"start\":")?;
    let start = c.u64()?;
    c.lit(b",\"end\":")?;
    let end = c.u64()?;
    c.lit(b",\"dev\":")?;
    let dev = c.u32()?;
    c.lit(b",\"ctx\":")?;
    let ctx = c.u32()?;
    c.lit(b",\"stream\":")?;
    let stream = c.u32()?;
    c.lit(b",\"corr\":")?;
    let corr = c.u32()?;
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
    let smem_executed = if c.lit(b",\"smem_executed\":").is_some() {
        Some(c.u32()?)
    } else {
        None
    };
    c.lit(b"}")?;
    (c.i == line.len()).then_some(Kernel {
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

    #[test]
    fn anything_unusual_is_left_to_serde() {
        let variants = [
            LINE.replace("\"regs\":64", "\"regs\":65536"), // u16 overflow
            LINE.replace("\"corr\":812", "\"corr\":4294967296"), // u32 overflow
            LINE.replace("\"start\":1234000100000", "\"start\":18446744073709551616"),
            LINE.replace("\"dev\":0", "\"dev\":00"), // leading zero
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
        assert_eq!(
            kernel(
                LINE.replace("\"smem_static\":0", "\"smem_static\":-2147483648")
                    .as_bytes()
            )
            .map(|k| k.smem_static),
            Some(i32::MIN)
        );
    }
}
