//! GPU facts for the session header, read through the CUDA driver API (loaded at run time).

use crate::driver::Driver;
use gpufl_trace::{Gpu, GpuLimits};
use std::ffi::c_char;

// CUdevice_attribute values (cuda.h; cudarc's `driver::sys::CUdevice_attribute_enum`, checked in
// the tests below), named without their CU_DEVICE_ATTRIBUTE_ prefix.
/// `MAX_THREADS_PER_BLOCK`
const ATTR_MAX_THREADS_PER_BLOCK: i32 = 1;
/// `MAX_SHARED_MEMORY_PER_BLOCK`
const ATTR_MAX_SHARED_MEMORY_PER_BLOCK: i32 = 8;
/// `WARP_SIZE`
const ATTR_WARP_SIZE: i32 = 10;
/// `MAX_REGISTERS_PER_BLOCK`
const ATTR_MAX_REGISTERS_PER_BLOCK: i32 = 12;
/// `CLOCK_RATE` (kHz)
const ATTR_CLOCK_RATE: i32 = 13;
/// `MULTIPROCESSOR_COUNT`
const ATTR_MULTIPROCESSOR_COUNT: i32 = 16;
/// `MEMORY_CLOCK_RATE` (kHz)
const ATTR_MEMORY_CLOCK_RATE: i32 = 36;
/// `GLOBAL_MEMORY_BUS_WIDTH` (bits)
const ATTR_GLOBAL_MEMORY_BUS_WIDTH: i32 = 37;
/// `L2_CACHE_SIZE` (bytes)
const ATTR_L2_CACHE_SIZE: i32 = 38;
/// `MAX_THREADS_PER_MULTIPROCESSOR`
const ATTR_MAX_THREADS_PER_MULTIPROCESSOR: i32 = 39;
/// `COMPUTE_CAPABILITY_MAJOR`
const ATTR_COMPUTE_CAPABILITY_MAJOR: i32 = 75;
/// `COMPUTE_CAPABILITY_MINOR`
const ATTR_COMPUTE_CAPABILITY_MINOR: i32 = 76;
/// `MAX_SHARED_MEMORY_PER_MULTIPROCESSOR` (bytes)
const ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: i32 = 81;
/// `MAX_REGISTERS_PER_MULTIPROCESSOR`
const ATTR_MAX_REGISTERS_PER_MULTIPROCESSOR: i32 = 82;
/// `MAX_SHARED_MEMORY_PER_BLOCK_OPTIN` (bytes)
const ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: i32 = 97;
/// `MAX_BLOCKS_PER_MULTIPROCESSOR`
const ATTR_MAX_BLOCKS_PER_MULTIPROCESSOR: i32 = 106;
/// `RESERVED_SHARED_MEMORY_PER_BLOCK` (bytes)
const ATTR_RESERVED_SHARED_MEMORY_PER_BLOCK: i32 = 111;

/// What the driver told us.
#[derive(Debug, Default)]
pub struct DeviceInfo {
    pub driver_version: Option<u32>,
    pub gpus: Vec<Gpu>,
    /// Why the list may be empty.
    pub error: Option<String>,
}

/// Query every visible GPU. Calls cuInit(0), which waits for an initialization in progress on
/// another thread; safe to call from a background thread at any time.
pub fn query() -> DeviceInfo {
    let Some(driver) = crate::driver::get() else {
        return DeviceInfo {
            error: Some("CUDA driver (libcuda.so.1) not found".into()),
            ..Default::default()
        };
    };
    // SAFETY: the driver's entry points, with their signatures.
    unsafe { query_with(driver) }
}

unsafe fn query_with(d: &Driver) -> DeviceInfo {
    let mut info = DeviceInfo::default();
    let (Some(init), Some(count), Some(get)) = (d.init, d.device_get_count, d.device_get) else {
        info.error = Some("CUDA driver lacks cuInit/cuDeviceGetCount".into());
        return info;
    };
    let rc = unsafe { init(0) };
    if rc != 0 {
        info.error = Some(format!("cuInit failed with CUresult {rc}"));
        return info;
    }
    if let Some(f) = d.driver_get_version {
        let mut v = 0;
        if unsafe { f(&mut v) } == 0 {
            info.driver_version = Some(v as u32);
        }
    }
    let (name_f, uuid_f) = (d.device_get_name, d.device_get_uuid);
    let (attr_f, mem_f) = (d.device_get_attribute, d.device_total_mem);
    let mut n = 0;
    if unsafe { count(&mut n) } != 0 {
        info.error = Some("cuDeviceGetCount failed".into());
        return info;
    }
    for ordinal in 0..n.max(0) {
        let mut dev = 0;
        if unsafe { get(&mut dev, ordinal) } != 0 {
            continue;
        }
        let mut g = Gpu {
            index: ordinal as u32,
            ..Default::default()
        };
        if let Some(f) = name_f {
            let mut buf = [0 as c_char; 256];
            if unsafe { f(buf.as_mut_ptr(), buf.len() as i32, dev) } == 0 {
                g.name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
                    .to_string_lossy()
                    .into_owned();
            }
        }
        if let Some(f) = uuid_f {
            let mut u = [0u8; 16];
            if unsafe { f(&mut u, dev) } == 0 {
                g.uuid = format_uuid(&u);
            }
        }
        if let Some(f) = attr_f {
            let attr = |a| {
                let mut v = 0;
                (unsafe { f(&mut v, a, dev) } == 0).then_some(v.max(0) as u32)
            };
            g.sm_count = attr(ATTR_MULTIPROCESSOR_COUNT).unwrap_or(0);
            g.cc_major = attr(ATTR_COMPUTE_CAPABILITY_MAJOR).unwrap_or(0);
            g.cc_minor = attr(ATTR_COMPUTE_CAPABILITY_MINOR).unwrap_or(0);
            g.limits = limits_from(attr);
        }
        if let Some(f) = mem_f {
            let mut m = 0usize;
            if unsafe { f(&mut m, dev) } == 0 {
                g.total_mem_bytes = m as u64;
            }
        }
        info.gpus.push(g);
    }
    info
}

/// The device's limits from `attr` (an attribute's value, None when the query failed): None when
/// a limit occupancy needs is missing; clocks and bus width are optional (0 counts as unknown).
pub fn limits_from(attr: impl Fn(i32) -> Option<u32>) -> Option<GpuLimits> {
    let known = |a| attr(a).filter(|&v| v > 0);
    let mem_clock_khz = known(ATTR_MEMORY_CLOCK_RATE);
    let mem_bus_bits = known(ATTR_GLOBAL_MEMORY_BUS_WIDTH);
    Some(GpuLimits {
        max_threads_per_block: attr(ATTR_MAX_THREADS_PER_BLOCK)?,
        max_threads_per_sm: attr(ATTR_MAX_THREADS_PER_MULTIPROCESSOR)?,
        max_blocks_per_sm: attr(ATTR_MAX_BLOCKS_PER_MULTIPROCESSOR)?,
        regs_per_sm: attr(ATTR_MAX_REGISTERS_PER_MULTIPROCESSOR)?,
        regs_per_block: attr(ATTR_MAX_REGISTERS_PER_BLOCK)?,
        smem_per_sm: attr(ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
        smem_per_block: attr(ATTR_MAX_SHARED_MEMORY_PER_BLOCK)?,
        smem_per_block_optin: attr(ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        smem_reserved_per_block: attr(ATTR_RESERVED_SHARED_MEMORY_PER_BLOCK)?,
        warp_size: attr(ATTR_WARP_SIZE)?,
        l2_bytes: attr(ATTR_L2_CACHE_SIZE)?,
        sm_clock_khz: known(ATTR_CLOCK_RATE),
        mem_clock_khz,
        mem_bus_bits,
        mem_bandwidth: mem_clock_khz
            .zip(mem_bus_bits)
            .map(|(c, b)| GpuLimits::peak_bandwidth(c, b)),
    })
}

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it.
pub fn format_uuid(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUdevice_attribute as A;

    /// The attribute numbers are cuda.h's (as cudarc's bindings spell them).
    #[test]
    fn attribute_numbers_match_the_driver_header() {
        let pairs = [
            (
                ATTR_MAX_THREADS_PER_BLOCK,
                A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            ),
            (
                ATTR_MAX_SHARED_MEMORY_PER_BLOCK,
                A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
            ),
            (ATTR_WARP_SIZE, A::CU_DEVICE_ATTRIBUTE_WARP_SIZE),
            (
                ATTR_MAX_REGISTERS_PER_BLOCK,
                A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK,
            ),
            (ATTR_CLOCK_RATE, A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
            (
                ATTR_MULTIPROCESSOR_COUNT,
                A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            ),
            (
                ATTR_MEMORY_CLOCK_RATE,
                A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE,
            ),
            (
                ATTR_GLOBAL_MEMORY_BUS_WIDTH,
                A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH,
            ),
            (ATTR_L2_CACHE_SIZE, A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
            (
                ATTR_MAX_THREADS_PER_MULTIPROCESSOR,
                A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
            ),
            (
                ATTR_COMPUTE_CAPABILITY_MAJOR,
                A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            ),
            (
                ATTR_COMPUTE_CAPABILITY_MINOR,
                A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            ),
            (
                ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            ),
            (
                ATTR_MAX_REGISTERS_PER_MULTIPROCESSOR,
                A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
            ),
            (
                ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            ),
            (
                ATTR_MAX_BLOCKS_PER_MULTIPROCESSOR,
                A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR,
            ),
            (
                ATTR_RESERVED_SHARED_MEMORY_PER_BLOCK,
                A::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK,
            ),
        ];
        for (ours, theirs) in pairs {
            assert_eq!(ours, theirs as i32, "{theirs:?}");
        }
    }

    /// What an H100 80GB HBM3 reports.
    fn h100(a: i32) -> Option<u32> {
        Some(match a {
            ATTR_MAX_THREADS_PER_BLOCK => 1024,
            ATTR_MAX_SHARED_MEMORY_PER_BLOCK => 49152,
            ATTR_WARP_SIZE => 32,
            ATTR_MAX_REGISTERS_PER_BLOCK => 65536,
            ATTR_CLOCK_RATE => 1_980_000,
            ATTR_MEMORY_CLOCK_RATE => 2_619_000,
            ATTR_GLOBAL_MEMORY_BUS_WIDTH => 5120,
            ATTR_L2_CACHE_SIZE => 52_428_800,
            ATTR_MAX_THREADS_PER_MULTIPROCESSOR => 2048,
            ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => 233_472,
            ATTR_MAX_REGISTERS_PER_MULTIPROCESSOR => 65536,
            ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => 232_448,
            ATTR_MAX_BLOCKS_PER_MULTIPROCESSOR => 32,
            ATTR_RESERVED_SHARED_MEMORY_PER_BLOCK => 1024,
            _ => return None,
        })
    }

    #[test]
    fn limits_map_each_attribute_to_its_field() {
        let l = limits_from(h100).unwrap();
        assert_eq!(
            (
                l.max_threads_per_block,
                l.max_threads_per_sm,
                l.max_blocks_per_sm
            ),
            (1024, 2048, 32)
        );
        assert_eq!((l.regs_per_sm, l.regs_per_block), (65536, 65536));
        assert_eq!(
            (
                l.smem_per_sm,
                l.smem_per_block,
                l.smem_per_block_optin,
                l.smem_reserved_per_block
            ),
            (233_472, 49152, 232_448, 1024)
        );
        assert_eq!((l.warp_size, l.l2_bytes), (32, 52_428_800));
        assert_eq!(l.sm_clock_khz, Some(1_980_000));
        assert_eq!(
            (l.mem_clock_khz, l.mem_bus_bits),
            (Some(2_619_000), Some(5120))
        );
        // 2 × 2.619 GHz × 640 bytes = 3.352 TB/s, the H100 SXM's 3.35 TB/s.
        assert_eq!(l.mem_bandwidth, Some(3_352_320_000_000));
    }

    #[test]
    fn a_missing_limit_drops_the_limits_and_missing_clocks_only_themselves() {
        assert_eq!(
            limits_from(|a| (a != ATTR_RESERVED_SHARED_MEMORY_PER_BLOCK)
                .then(|| h100(a))
                .flatten()),
            None
        );
        let l = limits_from(|a| match a {
            ATTR_MEMORY_CLOCK_RATE => Some(0),
            ATTR_CLOCK_RATE => None,
            _ => h100(a),
        })
        .unwrap();
        assert_eq!(
            (l.mem_clock_khz, l.sm_clock_khz, l.mem_bandwidth),
            (None, None, None)
        );
        assert_eq!(l.mem_bus_bits, Some(5120));
        assert_eq!(l.smem_per_sm, 233_472);
    }

    #[test]
    fn uuid_format_matches_nvidia_smi() {
        let u = [
            0x9f, 0x1e, 0x27, 0x5c, 0x8a, 0x31, 0x4b, 0x02, 0x91, 0x7d, 0x00, 0x11, 0x22, 0x33,
            0x44, 0x55,
        ];
        assert_eq!(
            super::format_uuid(&u),
            "GPU-9f1e275c-8a31-4b02-917d-001122334455"
        );
    }
}
