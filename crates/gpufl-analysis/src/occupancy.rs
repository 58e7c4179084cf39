//! Theoretical occupancy: how many blocks (and warps) of a kernel one SM can hold at once, and which
//! resource stops it holding more — registers, shared memory, warp slots or block slots.
//!
//! The calculation follows the CUDA occupancy calculator, `cudaOccMaxActiveBlocksPerMultiprocessor`
//! in `cuda_occupancy.h` (the header the CUDA toolkit ships; read from CUDA 12.6), which is what
//! `cudaOccupancyMaxActiveBlocksPerMultiprocessor` and Nsight Compute's "theoretical occupancy"
//! compute:
//!
//! - **warps:** a block takes `ceil(threads / warp size)` warp slots; an SM holds
//!   `max threads per SM / warp size` of them (a block larger than `max threads per block` cannot
//!   launch);
//! - **blocks:** at most `max blocks per SM`;
//! - **registers:** allocated per warp, `regs per thread × warp size` rounded up to the allocation
//!   unit (256 registers); the register file is split among the SM's 4 sub-partitions, each holding
//!   `floor((regs per SM / 4) / regs per warp)` warps. A block cannot launch when its registers,
//!   counted with its warps rounded up to a multiple of 4 (the hardware's check), exceed
//!   `regs per block`, or when it uses more than 255 registers per thread;
//! - **shared memory:** per block, `static + dynamic + the driver's reserved shared memory per
//!   block` rounded up to the allocation unit (128 bytes from compute capability 8.0; 256 before),
//!   out of the shared memory per SM (the carveout). A block needing more than `shared memory per
//!   block` (the opt-in maximum when it uses more than the default 48 KiB) + the reserved part
//!   cannot launch. The calculator assumes the largest carveout unless a preference says
//!   otherwise; here the carveout the driver actually configured for the launch (CUPTI's
//!   `sharedMemoryExecuted`) is used when it was recorded and holds at least one block, else the
//!   largest (`smem_per_sm`).
//!
//! Active blocks per SM are the least of the four; every resource that reaches that least is a
//! limiter. Occupancy = active warps / max warps per SM. Partitioned global caching (compute
//! capability 5.2–6.x) and block barriers (never limiting at one barrier per block) are left out.
//!
//! **Constants** (H100, compute capability 9.0): 65536 registers per SM and per block, 255
//! registers per thread at most, register allocation unit 256 per warp, 4 sub-partitions, 64 warps
//! (2048 threads) and 32 blocks per SM, 1024 threads per block, 228 KiB shared memory per SM with
//! carveouts of 0, 8, 16, 32, 64, 100, 132, 164, 196 or 228 KiB, 48 KiB per block by default and
//! 227 KiB opted in, 1 KiB reserved per block, shared allocation unit 128 bytes. Sources: the
//! CUDA C++ Programming Guide's technical specifications per compute capability and the Hopper
//! tuning guide (registers, warps, blocks, shared memory sizes, 227 KiB per block),
//! `cuda_occupancy.h` (allocation units and granularities, sub-partitions, carveout sizes, the
//! reserved shared memory added to each block's share, the algorithm). The device's own figures
//! come from the session header (`GpuLimits`, read with `cuDeviceGetAttribute`); the allocation
//! units are the architecture's, by compute capability. Traces recorded before the header had
//! limits get the table above for compute capability 9.0, and no occupancy otherwise.
//!
//! The unit tests below check the calculation against hand-derived figures for H100; the CUDA
//! runtime's own figures for the same cases come from `examples/occupancy_check.cu` (run on the
//! H100 by `scripts/gpu-check.sh kernels`).

use gpufl_trace::Gpu;
use serde::Serialize;

/// Where a device's limits came from.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LimitsSource {
    /// The session header (`gpus[].limits`, read from the driver).
    Header,
    /// Not in the header (an older recorder): the compute capability's published figures.
    ComputeCapability,
}

/// Everything the occupancy of a kernel on one SM depends on.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct SmLimits {
    pub cc_major: u32,
    pub cc_minor: u32,
    pub sm_count: u32,
    pub warp_size: u32,
    pub max_threads_per_block: u32,
    pub max_warps_per_sm: u32,
    pub max_blocks_per_sm: u32,
    pub regs_per_sm: u32,
    pub regs_per_block: u32,
    pub max_regs_per_thread: u32,
    /// Registers are allocated to a warp in multiples of this.
    pub reg_alloc_unit: u32,
    /// The register file is split evenly among this many sub-partitions (warp schedulers).
    pub sub_partitions: u32,
    /// The largest carveout, bytes.
    pub smem_per_sm: u32,
    pub smem_per_block: u32,
    pub smem_per_block_optin: u32,
    pub smem_reserved_per_block: u32,
    /// Shared memory is allocated to a block in multiples of this, bytes.
    pub smem_alloc_unit: u32,
    pub source: LimitsSource,
}

impl SmLimits {
    /// An H100 (SXM, 132 SMs), compute capability 9.0, from the published figures.
    pub fn h100() -> SmLimits {
        SmLimits {
            cc_major: 9,
            cc_minor: 0,
            sm_count: 132,
            warp_size: 32,
            max_threads_per_block: 1024,
            max_warps_per_sm: 64,
            max_blocks_per_sm: 32,
            regs_per_sm: 65536,
            regs_per_block: 65536,
            max_regs_per_thread: 255,
            reg_alloc_unit: 256,
            sub_partitions: 4,
            smem_per_sm: 228 * 1024,
            smem_per_block: 48 * 1024,
            smem_per_block_optin: 227 * 1024,
            smem_reserved_per_block: 1024,
            smem_alloc_unit: 128,
            source: LimitsSource::ComputeCapability,
        }
    }

    /// The limits of a GPU of the session header: its recorded limits with its architecture's
    /// allocation units, or, without recorded limits, the published figures of compute capability
    /// 9.0 (None for others, and for compute capabilities before 7.0, whose units differ).
    pub fn from_gpu(g: &Gpu) -> Option<SmLimits> {
        if g.cc_major < 7 || g.sm_count == 0 {
            return None;
        }
        let Some(l) = &g.limits else {
            return ((g.cc_major, g.cc_minor) == (9, 0)).then(|| SmLimits {
                sm_count: g.sm_count,
                ..SmLimits::h100()
            });
        };
        if l.warp_size == 0 || l.max_threads_per_sm < l.warp_size {
            return None;
        }
        Some(SmLimits {
            cc_major: g.cc_major,
            cc_minor: g.cc_minor,
            sm_count: g.sm_count,
            warp_size: l.warp_size,
            max_threads_per_block: l.max_threads_per_block,
            max_warps_per_sm: l.max_threads_per_sm / l.warp_size,
            max_blocks_per_sm: l.max_blocks_per_sm,
            regs_per_sm: l.regs_per_sm,
            regs_per_block: l.regs_per_block,
            max_regs_per_thread: 255,
            // cuda_occupancy.h: 256 registers and 4 sub-partitions for every architecture from
            // 7.0 to 9.0 (assumed unchanged after it); shared memory in 256-byte units on 7.x,
            // 128-byte units from 8.0.
            reg_alloc_unit: 256,
            sub_partitions: 4,
            smem_per_sm: l.smem_per_sm,
            smem_per_block: l.smem_per_block,
            smem_per_block_optin: l.smem_per_block_optin.max(l.smem_per_block),
            smem_reserved_per_block: l.smem_reserved_per_block,
            smem_alloc_unit: if g.cc_major >= 8 { 128 } else { 256 },
            source: LimitsSource::Header,
        })
    }
}

/// A resource that caps the number of resident blocks.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Limiter {
    Registers,
    SharedMemory,
    Warps,
    Blocks,
}

impl Limiter {
    /// For prose: "registers", "shared memory", "warps", "blocks".
    pub fn name(self) -> &'static str {
        match self {
            Limiter::Registers => "registers",
            Limiter::SharedMemory => "shared memory",
            Limiter::Warps => "warps",
            Limiter::Blocks => "blocks",
        }
    }
}

/// What a kernel needs per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockUse {
    pub threads: u32,
    /// Registers per thread.
    pub regs: u32,
    /// Static + dynamic shared memory, bytes (the driver's reserved part is added here).
    pub smem: u32,
    /// The carveout the driver configured for the launch, bytes, when known.
    pub carveout: Option<u32>,
}

/// Theoretical occupancy of one launch configuration.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Occupancy {
    pub warps_per_block: u32,
    /// Registers allocated to one block (per warp rounded up to the allocation unit).
    pub regs_per_block: u32,
    /// Shared memory allocated to one block, reserved part included, rounded up, bytes.
    pub smem_per_block: u32,
    /// The shared memory per SM the calculation used, bytes, and whether it is the carveout the
    /// driver configured (`executed`) or the largest one.
    pub smem_per_sm: u32,
    pub carveout_executed: bool,
    /// Blocks one SM can hold under each limit (None: that resource sets no limit).
    pub limit_registers: Option<u32>,
    pub limit_shared_memory: Option<u32>,
    pub limit_warps: u32,
    pub limit_blocks: u32,
    /// Resident blocks and warps per SM.
    pub blocks_per_sm: u32,
    pub warps_per_sm: u32,
    /// `warps_per_sm / max warps per SM`, 0..1.
    pub occupancy: f64,
    /// Every resource that caps `blocks_per_sm` (ties included), registers first.
    pub limited_by: Vec<Limiter>,
}

impl Occupancy {
    /// The first limiter (registers, shared memory, warps, blocks in that order of preference).
    pub fn limiter(&self) -> Option<Limiter> {
        self.limited_by.first().copied()
    }
}

fn round_up(x: u64, unit: u64) -> u64 {
    if unit == 0 {
        x
    } else {
        x.div_ceil(unit) * unit
    }
}

fn sat(v: u64) -> u32 {
    v.min(u32::MAX as u64) as u32
}

/// Theoretical occupancy of blocks using `b` on an SM with limits `l`; None when the block is empty
/// (0 threads). A block that cannot run at all gets 0 blocks per SM, limited by what it exceeds.
pub fn occupancy(l: &SmLimits, b: BlockUse) -> Option<Occupancy> {
    if b.threads == 0 || l.warp_size == 0 {
        return None;
    }
    let warp = l.warp_size as u64;
    let warps = (b.threads as u64).div_ceil(warp);

    // Warp slots.
    let limit_warps = if b.threads > l.max_threads_per_block {
        0
    } else {
        sat(l.max_warps_per_sm as u64 / warps)
    };

    // Registers, allocated per warp, the file split among the sub-partitions.
    let parts = l.sub_partitions.max(1) as u64;
    let regs_per_warp = round_up(b.regs as u64 * warp, l.reg_alloc_unit as u64);
    let regs_block = regs_per_warp * warps;
    let regs_assumed = regs_per_warp * round_up(warps, parts);
    let limit_registers = if b.regs > l.max_regs_per_thread
        || regs_assumed > l.regs_per_block as u64
        || regs_block > l.regs_per_block as u64
    {
        Some(0)
    } else {
        // No registers (None): no limit.
        ((l.regs_per_sm as u64 / parts).checked_div(regs_per_warp))
            .map(|per_part| sat(per_part * parts / warps))
    };

    // Shared memory, with the driver's reserved part, out of the carveout.
    let smem_block = round_up(
        b.smem as u64 + l.smem_reserved_per_block as u64,
        l.smem_alloc_unit as u64,
    );
    let per_block_max = if b.smem > l.smem_per_block {
        l.smem_per_block_optin
    } else {
        l.smem_per_block
    } as u64
        + l.smem_reserved_per_block as u64;
    let (smem_sm, executed) = match b.carveout {
        Some(c) if c > 0 && c as u64 >= smem_block => (c, true),
        _ => (l.smem_per_sm, false),
    };
    let limit_shared_memory = if smem_block > per_block_max {
        Some(0)
    } else {
        // Nothing allocated (None: no reserved part on this device): no limit.
        (smem_sm as u64).checked_div(smem_block).map(sat)
    };

    let limit_blocks = l.max_blocks_per_sm;
    let blocks = [
        limit_registers.unwrap_or(u32::MAX),
        limit_shared_memory.unwrap_or(u32::MAX),
        limit_warps,
        limit_blocks,
    ]
    .into_iter()
    .min()
    .unwrap_or(0);
    let mut limited_by = Vec::new();
    if limit_registers == Some(blocks) {
        limited_by.push(Limiter::Registers);
    }
    if limit_shared_memory == Some(blocks) {
        limited_by.push(Limiter::SharedMemory);
    }
    if limit_warps == blocks {
        limited_by.push(Limiter::Warps);
    }
    if limit_blocks == blocks {
        limited_by.push(Limiter::Blocks);
    }
    let warps_per_sm = sat(blocks as u64 * warps);
    let occupancy = if l.max_warps_per_sm == 0 {
        0.0
    } else {
        (warps_per_sm as f64 / l.max_warps_per_sm as f64).min(1.0)
    };
    Some(Occupancy {
        warps_per_block: sat(warps),
        regs_per_block: sat(regs_block),
        smem_per_block: sat(smem_block),
        smem_per_sm: smem_sm,
        carveout_executed: executed,
        limit_registers,
        limit_shared_memory,
        limit_warps,
        limit_blocks,
        blocks_per_sm: blocks,
        warps_per_sm,
        occupancy,
        limited_by,
    })
}

/// Blocks per SM needed to reach `target` occupancy (0..1) with `warps_per_block`-warp blocks.
pub fn blocks_for(l: &SmLimits, warps_per_block: u32, target: f64) -> u32 {
    let want = (l.max_warps_per_sm as f64 * target).ceil() as u32;
    want.div_ceil(warps_per_block.max(1))
}

/// The most registers per thread (a multiple of the allocation unit per thread, as the allocator
/// rounds anyway) at which `b` reaches `target` occupancy, other resources unchanged; None when no
/// register count does (another resource caps it).
pub fn regs_for(l: &SmLimits, b: BlockUse, target: f64) -> Option<u32> {
    let step = (l.reg_alloc_unit / l.warp_size.max(1)).max(1);
    let mut r = (b.regs.min(l.max_regs_per_thread) / step) * step;
    loop {
        let o = occupancy(l, BlockUse { regs: r, ..b })?;
        if o.occupancy + 1e-9 >= target {
            return Some(r);
        }
        if r < step {
            return None;
        }
        r -= step;
    }
}

/// The most static + dynamic shared memory per block (bytes, whole allocation units less the
/// reserved part) at which `b` reaches `target` occupancy with the largest carveout, other
/// resources unchanged; None when no size does.
pub fn smem_for(l: &SmLimits, b: BlockUse, target: f64) -> Option<u32> {
    let o = occupancy(
        l,
        BlockUse {
            smem: 0,
            carveout: None,
            ..b
        },
    )?;
    if o.occupancy + 1e-9 < target {
        return None;
    }
    let need = blocks_for(l, o.warps_per_block, target).max(1);
    let unit = l.smem_alloc_unit.max(1);
    let per_block = (l.smem_per_sm / need / unit) * unit;
    Some(per_block.saturating_sub(l.smem_reserved_per_block))
}

/// Waves of a grid: `blocks / (blocks_per_sm × SMs)`; None when nothing fits on an SM.
pub fn waves(l: &SmLimits, blocks_per_sm: u32, grid_blocks: u64) -> Option<f64> {
    let per_wave = blocks_per_sm as u64 * l.sm_count as u64;
    (per_wave > 0).then(|| grid_blocks as f64 / per_wave as f64)
}

#[cfg(test)]
#[path = "occupancy_tests.rs"]
mod tests;
