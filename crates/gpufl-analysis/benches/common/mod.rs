//! Shared by the `load` bench and the `decodebench` example: the synthetic session generator and a
//! counting global allocator (current and peak heap bytes).

#![allow(dead_code)]

use gpufl_trace::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

pub struct Counting;
pub static CURRENT: AtomicUsize = AtomicUsize::new(0);
pub static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = System.alloc(l);
        if !p.is_null() {
            let now = CURRENT.fetch_add(l.size(), Relaxed) + l.size();
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l);
        CURRENT.fetch_sub(l.size(), Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = System.realloc(p, l, new);
        if !q.is_null() {
            if new >= l.size() {
                let now = CURRENT.fetch_add(new - l.size(), Relaxed) + (new - l.size());
                PEAK.fetch_max(now, Relaxed);
            } else {
                CURRENT.fetch_sub(l.size() - new, Relaxed);
            }
        }
        q
    }
}

pub fn records() -> usize {
    std::env::var("GPUFL_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000)
}

/// A session of `n` timed records: per 100 records, 95 kernels (20 names, 2 streams), 3 stream
/// syncs with stacks (4 call sites) and 2 device-to-host copies; a zstd block every 50 000
/// records (about every 0.2 s of trace time, as the recorder closes one at least every second).
pub fn generate(n: usize) -> Vec<u8> {
    let header = Header {
        session_id: "bench-1-20261122T000000Z".into(),
        app_name: "bench".into(),
        gpus: vec![Gpu {
            name: "synthetic".into(),
            sm_count: 132,
            cc_major: 9,
            cc_minor: 0,
            limits: Some(GpuLimits {
                max_threads_per_block: 1024,
                max_threads_per_sm: 2048,
                max_blocks_per_sm: 32,
                regs_per_sm: 65536,
                regs_per_block: 65536,
                smem_per_sm: 233_472,
                smem_per_block: 49_152,
                smem_per_block_optin: 232_448,
                smem_reserved_per_block: 1024,
                warp_size: 32,
                l2_bytes: 52_428_800,
                ..GpuLimits::default()
            }),
            ..Gpu::default()
        }],
        capture: CaptureStatus {
            status: "ok".into(),
            reason: None,
        },
        ..Header::default()
    };
    let mut w = TraceWriter::new(Vec::with_capacity(n * 12), &header).unwrap();
    let names: Vec<StrId> = (0..20)
        .map(|i| {
            w.intern_str(&format!(
                "void kernel_{i}<float, 128>(float const*, float*, int)"
            ))
            .unwrap()
        })
        .collect();
    let module = w
        .intern_str("/usr/lib/x86_64-linux-gnu/libcuda.so.1")
        .unwrap();
    let app = w.intern_str("/opt/app/bin/train").unwrap();
    let file = w.intern_str("/opt/app/src/train.cu").unwrap();
    let stacks: Vec<StackId> = (0..4u32)
        .map(|i| {
            let func = w.intern_str(&format!("step_{i}(int)")).unwrap();
            let mut frames = vec![w
                .intern_frame(FrameData {
                    kind: FrameKind::Native,
                    module: Some(module),
                    offset: Some(0x4cb045),
                    func: None,
                    file: None,
                    line: None,
                    inlined: false,
                    text: None,
                })
                .unwrap()];
            frames.push(
                w.intern_frame(FrameData {
                    kind: FrameKind::Native,
                    module: Some(app),
                    offset: Some(0x1000 + i as u64),
                    func: Some(func),
                    file: Some(file),
                    line: Some(50 + i),
                    inlined: false,
                    text: None,
                })
                .unwrap(),
            );
            w.intern_stack(&frames).unwrap()
        })
        .collect();
    // Times, durations and correlation gaps jitter (xorshift), so the trace compresses about as
    // well as a real one (~17 bytes per kernel record in the launch-bound PyTorch session).
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move |m: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    };
    let mut t: u64 = 1_795_328_337_000_000_000;
    let mut corr = 0u32;
    for i in 0..n {
        corr += 1 + rnd(4) as u32;
        t += 300 + rnd(6_000);
        // The same 95-kernel sequence every iteration, as in a training loop.
        let k = (i % 100) % names.len();
        let rec = match i % 100 {
            10 | 50 | 90 => Record::Sync(Sync {
                kind: SyncKind::StreamSynchronize,
                start: t,
                end: t + 800 + rnd(20_000),
                ctx: 1,
                stream: Some(7),
                corr,
                tid: Some(4242),
                stack: Some(stacks[(i / 100) % 2 + (i % 100 == 50) as usize * 2]),
                ..Sync::default()
            }),
            30 | 70 => Record::Memcpy(Memcpy {
                kind: CopyKind::DtoH,
                src_kind: MemoryKind::Device,
                dst_kind: MemoryKind::Pinned,
                bytes: 4096 << rnd(12),
                start: t,
                end: t + 1_000 + rnd(50_000),
                dev: 0,
                ctx: 1,
                stream: 13,
                corr,
                graph: None,
            }),
            _ => Record::Kernel(Kernel {
                name: names[k],
                start: t,
                end: t + 1_000 + (k as u64 * 1_700) + rnd(4_000),
                dev: 0,
                ctx: 1,
                stream: [13, 7, 7, 7, 7][k % 5],
                corr,
                grid: [(k as i32 + 1) * 64, 1 + (k % 3) as i32, 1],
                block: [128 << (k % 3), 1, 1],
                regs: 24 + (k % 6) as u16 * 8,
                smem_static: (k % 4) as i32 * 4096,
                smem_dynamic: [49_152, 0, 0, 0, 0, 0, 0][k % 7],
                local_mem: [0, 0, 0, 0, 0, 24][k % 6],
                smem_executed: Some(233_472),
                graph: None,
            }),
        };
        w.write(&rec).unwrap();
        if i % 50_000 == 49_999 {
            w.end_block().unwrap();
        }
    }
    w.finish(0, "exit").unwrap()
}
