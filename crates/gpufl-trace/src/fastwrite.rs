//! Hand-written serialization of the two records a recorder writes by the hundred thousand
//! (kernels and API calls): the same bytes serde_json writes for them (tested below), at a third of
//! its cost. Every other record goes through serde.

use crate::records::{Api, ApiDomain, Kernel};

fn num(out: &mut Vec<u8>, key: &[u8], v: impl itoa::Integer) {
    out.extend_from_slice(key);
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

fn triple(out: &mut Vec<u8>, key: &[u8], v: [i32; 3]) {
    num(out, key, v[0]);
    num(out, b",", v[1]);
    num(out, b",", v[2]);
    out.push(b']');
}

/// Append `k` as serde_json writes `Record::Kernel(k)`, without the newline.
pub(crate) fn kernel(out: &mut Vec<u8>, k: &Kernel) {
    num(out, b"{\"t\":\"kernel\",\"name\":", k.name.0);
    num(out, b",\"start\":", k.start);
    num(out, b",\"end\":", k.end);
    num(out, b",\"dev\":", k.dev);
    num(out, b",\"ctx\":", k.ctx);
    num(out, b",\"stream\":", k.stream);
    num(out, b",\"corr\":", k.corr);
    triple(out, b",\"grid\":[", k.grid);
    triple(out, b",\"block\":[", k.block);
    num(out, b",\"regs\":", k.regs);
    num(out, b",\"smem_static\":", k.smem_static);
    num(out, b",\"smem_dynamic\":", k.smem_dynamic);
    num(out, b",\"local_mem\":", k.local_mem);
    if let Some(v) = k.smem_executed {
        num(out, b",\"smem_executed\":", v);
    }
    if let Some(g) = k.graph {
        num(out, b",\"graph\":[", g.0);
        num(out, b",", g.1);
        out.push(b']');
    }
    out.push(b'}');
}

/// Append `a` as serde_json writes `Record::Api(a)`, without the newline.
pub(crate) fn api(out: &mut Vec<u8>, a: &Api) {
    out.extend_from_slice(match a.domain {
        ApiDomain::Runtime => b"{\"t\":\"api\",\"domain\":\"runtime\"".as_slice(),
        ApiDomain::Driver => b"{\"t\":\"api\",\"domain\":\"driver\"",
        ApiDomain::Unknown => b"{\"t\":\"api\",\"domain\":\"unknown\"",
    });
    num(out, b",\"name\":", a.name.0);
    num(out, b",\"cbid\":", a.cbid);
    num(out, b",\"start\":", a.start);
    num(out, b",\"end\":", a.end);
    num(out, b",\"tid\":", a.tid);
    num(out, b",\"corr\":", a.corr);
    num(out, b",\"ret\":", a.ret);
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::StrId;
    use crate::records::Record;

    /// A cheap deterministic generator covering small, large and negative values.
    fn values(seed: u64) -> impl Iterator<Item = u64> {
        let mut x = seed | 1;
        std::iter::from_fn(move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            Some(match x % 4 {
                0 => x % 10,
                1 => x % 100_000,
                2 => x >> (x % 64),
                _ => x,
            })
        })
    }

    #[test]
    fn kernel_and_api_lines_match_serde() {
        let mut v = values(0x9e3779b97f4a7c15);
        let mut n = || v.next().unwrap();
        for _ in 0..2000 {
            let k = Kernel {
                name: StrId(n() as u32),
                start: n(),
                end: n(),
                dev: n() as u32,
                ctx: n() as u32,
                stream: n() as u32,
                corr: n() as u32,
                grid: [n() as i32, n() as i32, -(n() as i32)],
                block: [n() as i32, 1, n() as i32],
                regs: n() as u16,
                smem_static: n() as i32,
                smem_dynamic: -(n() as i32),
                local_mem: n() as u32,
                smem_executed: (n() % 3 != 0).then(|| n() as u32),
                graph: (n() % 3 == 0).then(|| crate::records::GraphNode(n() as u32, n())),
            };
            let mut fast = Vec::new();
            kernel(&mut fast, &k);
            assert_eq!(
                String::from_utf8(fast).unwrap(),
                serde_json::to_string(&Record::Kernel(k)).unwrap()
            );
            for domain in [ApiDomain::Runtime, ApiDomain::Driver, ApiDomain::Unknown] {
                let a = Api {
                    domain,
                    name: StrId(n() as u32),
                    cbid: n() as u32,
                    start: n(),
                    end: n(),
                    tid: n(),
                    corr: n() as u32,
                    ret: n() as u32,
                };
                let mut fast = Vec::new();
                api(&mut fast, &a);
                assert_eq!(
                    String::from_utf8(fast).unwrap(),
                    serde_json::to_string(&Record::Api(a)).unwrap()
                );
            }
        }
    }
}
