//! Occupancy on H100 (compute capability 9.0), each expected figure derived by hand in the
//! comments with the CUDA occupancy calculator's rules (module doc): 64 warps and 32 blocks per
//! SM, 65536 registers split in 4 sub-partitions of 16384, registers per warp rounded up to 256,
//! 233472 bytes (228 KiB) of shared memory per SM, 1024 bytes reserved per block, shared memory
//! rounded up to 128 bytes.

use super::*;
use gpufl_trace::GpuLimits;

fn h100(threads: u32, regs: u32, smem: u32) -> Occupancy {
    occupancy(
        &SmLimits::h100(),
        BlockUse {
            threads,
            regs,
            smem,
            carveout: None,
        },
    )
    .expect("a non-empty block")
}

/// (blocks per SM, warps per SM, occupancy in %, limiters).
fn summary(o: &Occupancy) -> (u32, u32, f64, Vec<Limiter>) {
    (
        o.blocks_per_sm,
        o.warps_per_sm,
        (o.occupancy * 1000.0).round() / 10.0,
        o.limited_by.clone(),
    )
}

#[test]
fn full_occupancy_limited_by_registers_and_warps_together() {
    // 256 threads = 8 warps; warp slots: 64 / 8 = 8 blocks.
    // 32 regs × 32 threads = 1024 per warp (a multiple of 256); 16384 / 1024 = 16 warps per
    // sub-partition, × 4 = 64 warps per SM, / 8 = 8 blocks.
    // Shared memory: 0 + 1024 reserved = 1024; 233472 / 1024 = 228 blocks. Block slots: 32.
    // min(8, 228, 8, 32) = 8 blocks = 64 warps = 100 %.
    let o = h100(256, 32, 0);
    assert_eq!(
        summary(&o),
        (8, 64, 100.0, vec![Limiter::Registers, Limiter::Warps])
    );
    assert_eq!(o.limit_shared_memory, Some(228));
    assert_eq!(o.regs_per_block, 8192);
    assert_eq!(o.smem_per_block, 1024);
}

#[test]
fn registers_128_at_256_threads_give_a_quarter() {
    // 128 × 32 = 4096 registers per warp; 16384 / 4096 = 4 warps per sub-partition, 16 per SM;
    // 16 / 8 warps per block = 2 blocks = 16 warps = 25 %.
    let o = h100(256, 128, 0);
    assert_eq!(summary(&o), (2, 16, 25.0, vec![Limiter::Registers]));
    // The fix: 50 % = 32 warps = 4 blocks of 8 warps; 4 blocks need 8 warps per sub-partition,
    // 16384 / 8 = 2048 registers per warp = 64 per thread.
    let b = BlockUse {
        threads: 256,
        regs: 128,
        smem: 0,
        carveout: None,
    };
    assert_eq!(regs_for(&SmLimits::h100(), b, 0.5), Some(64));
    assert_eq!(blocks_for(&SmLimits::h100(), 8, 0.5), 4);
    // 72 registers would not do: 72 × 32 = 2304 per warp, 16384 / 2304 = 7 warps per
    // sub-partition, 28 per SM, 3 blocks = 24 warps = 37.5 %.
    assert_eq!(summary(&h100(256, 72, 0)).2, 37.5);
}

#[test]
fn registers_are_split_among_sub_partitions() {
    // 96 threads = 3 warps. 40 × 32 = 1280 registers per warp (5 × 256).
    // Per sub-partition: 16384 / 1280 = 12.8 → 12 warps; × 4 = 48 warps; 48 / 3 = 16 blocks.
    // (The whole file at once would give 65536 / 1280 = 51 warps, 17 blocks.)
    // Warp slots: 64 / 3 = 21 blocks. 16 blocks × 3 warps = 48 warps = 75 %.
    let o = h100(96, 40, 0);
    assert_eq!(summary(&o), (16, 48, 75.0, vec![Limiter::Registers]));
    assert_eq!(o.limit_warps, 21);
}

#[test]
fn registers_round_up_to_the_allocation_unit() {
    // 255 × 32 = 8160 → 8192 per warp; 16384 / 8192 = 2 warps per sub-partition, 8 per SM;
    // 256 threads = 8 warps: 1 block = 12.5 %.
    assert_eq!(
        summary(&h100(256, 255, 0)),
        (1, 8, 12.5, vec![Limiter::Registers])
    );
    // 33 registers: 1056 → 1280 per warp, as 40 registers (the test above): 16 blocks of 96.
    assert_eq!(h100(96, 33, 0).blocks_per_sm, 16);
}

#[test]
fn a_block_over_the_per_block_register_check_cannot_launch() {
    // 320 threads = 10 warps, 200 × 32 = 6400 registers per warp (25 × 256): 64000 for the
    // block fits 65536, but the hardware check counts warps rounded up to a multiple of 4:
    // 6400 × 12 = 76800 > 65536 → no block.
    let o = h100(320, 200, 0);
    assert_eq!(summary(&o), (0, 0, 0.0, vec![Limiter::Registers]));
    // 160 registers: 5120 × 12 = 61440 ≤ 65536: 16384 / 5120 = 3 warps per sub-partition,
    // 12 per SM, 1 block of 10 warps = 15.6 %.
    assert_eq!(
        summary(&h100(320, 160, 0)),
        (1, 10, 15.6, vec![Limiter::Registers])
    );
    // More than 255 registers per thread never launches.
    assert_eq!(h100(32, 256, 0).blocks_per_sm, 0);
}

#[test]
fn shared_memory_48k_at_128_threads() {
    // 49152 + 1024 reserved = 50176 bytes (392 × 128); 233472 / 50176 = 4.65 → 4 blocks.
    // Registers: 32 × 32 = 1024 per warp → 64 warps / 4 = 16 blocks; warp slots 16.
    // 4 blocks × 4 warps = 16 warps = 25 %.
    let o = h100(128, 32, 49152);
    assert_eq!(summary(&o), (4, 16, 25.0, vec![Limiter::SharedMemory]));
    assert_eq!(o.smem_per_block, 50176);
    // The fix: 50 % = 32 warps = 8 blocks; 233472 / 8 = 29184 bytes a block (228 × 128), less
    // the 1024 reserved: 28160 bytes of static + dynamic shared memory.
    let b = BlockUse {
        threads: 128,
        regs: 32,
        smem: 49152,
        carveout: None,
    };
    assert_eq!(smem_for(&SmLimits::h100(), b, 0.5), Some(28160));
    assert_eq!(h100(128, 32, 28160).blocks_per_sm, 8);
    assert_eq!(h100(128, 32, 28161).blocks_per_sm, 7);
}

#[test]
fn opted_in_shared_memory_and_beyond_it() {
    // 100 KiB = 102400 bytes needs the opt-in (> 48 KiB): the limit is 232448 + 1024.
    // 102400 + 1024 = 103424; 233472 / 103424 = 2.26 → 2 blocks of 8 warps = 25 %.
    assert_eq!(
        summary(&h100(256, 32, 102400)),
        (2, 16, 25.0, vec![Limiter::SharedMemory])
    );
    // 227 KiB = 232448, the opt-in maximum: 233472 = the whole SM → 1 block.
    assert_eq!(h100(256, 32, 232448).blocks_per_sm, 1);
    // One byte more: 232449 + 1024 → 233600 > 233472 → no block.
    assert_eq!(
        summary(&h100(256, 32, 232449)),
        (0, 0, 0.0, vec![Limiter::SharedMemory])
    );
}

#[test]
fn tiny_blocks_are_limited_by_block_slots() {
    // 32 threads = 1 warp; registers: 16 × 32 = 512 per warp → 32 per sub-partition, 128
    // warps → 128 blocks; shared memory: 228 blocks; warp slots 64; block slots 32.
    // 32 blocks × 1 warp = 50 %.
    assert_eq!(
        summary(&h100(32, 16, 0)),
        (32, 32, 50.0, vec![Limiter::Blocks])
    );
    // 16 threads still take a whole warp.
    assert_eq!(
        summary(&h100(16, 16, 0)),
        (32, 32, 50.0, vec![Limiter::Blocks])
    );
}

#[test]
fn large_blocks_are_limited_by_warp_slots() {
    // 1024 threads = 32 warps: 64 / 32 = 2 blocks = 100 %; 768 threads = 24 warps: 2 blocks =
    // 48 warps = 75 % (16 registers: the file holds 128 warps).
    assert_eq!(
        summary(&h100(768, 16, 0)),
        (2, 48, 75.0, vec![Limiter::Warps])
    );
    // More threads than a block may have: no block.
    assert_eq!(h100(2048, 16, 0).blocks_per_sm, 0);
    assert_eq!(h100(2048, 16, 0).limited_by, vec![Limiter::Warps]);
}

#[test]
fn the_executed_carveout_is_used_when_it_holds_a_block() {
    let l = SmLimits::h100();
    let with = |carveout| {
        occupancy(
            &l,
            BlockUse {
                threads: 256,
                regs: 32,
                smem: 8192,
                carveout,
            },
        )
        .unwrap()
    };
    // 8192 + 1024 = 9216 bytes a block. In the 32 KiB carveout the driver chose: 32768 / 9216
    // = 3.56 → 3 blocks of 8 warps = 37.5 %, shared memory.
    let o = with(Some(32768));
    assert_eq!(summary(&o), (3, 24, 37.5, vec![Limiter::SharedMemory]));
    assert!(o.carveout_executed);
    // Without it, the largest: 233472 / 9216 = 25 blocks, so registers and warps cap at 8.
    assert_eq!(with(None).blocks_per_sm, 8);
    // A recorded carveout too small for one block (8 KiB < 9216) is not believed.
    let o = with(Some(8192));
    assert_eq!((o.blocks_per_sm, o.carveout_executed), (8, false));
}

#[test]
fn zero_registers_and_empty_blocks() {
    // No registers: no register limit.
    assert_eq!(h100(256, 0, 0).limit_registers, None);
    assert_eq!(
        occupancy(
            &SmLimits::h100(),
            BlockUse {
                threads: 0,
                regs: 32,
                smem: 0,
                carveout: None
            }
        ),
        None
    );
}

#[test]
fn waves_of_a_grid() {
    let l = SmLimits::h100();
    // 8 blocks per SM × 132 SMs = 1056 blocks a wave.
    assert_eq!(waves(&l, 8, 1056), Some(1.0));
    assert_eq!(waves(&l, 8, 1188), Some(1.125));
    assert_eq!(waves(&l, 0, 10), None);
}

#[test]
fn limits_from_the_header_or_the_compute_capability() {
    let mut g = Gpu {
        sm_count: 114,
        cc_major: 9,
        cc_minor: 0,
        ..Gpu::default()
    };
    // No recorded limits, 9.0: the published figures with the GPU's SM count (an H100 PCIe).
    let l = SmLimits::from_gpu(&g).unwrap();
    assert_eq!(
        (l.sm_count, l.source),
        (114, LimitsSource::ComputeCapability)
    );
    assert_eq!(l.smem_per_sm, 233472);
    // Recorded limits win and give the warps per SM.
    g.limits = Some(GpuLimits {
        max_threads_per_block: 1024,
        max_threads_per_sm: 1536,
        max_blocks_per_sm: 16,
        regs_per_sm: 65536,
        regs_per_block: 65536,
        smem_per_sm: 102400,
        smem_per_block: 49152,
        smem_per_block_optin: 101376,
        smem_reserved_per_block: 1024,
        warp_size: 32,
        l2_bytes: 1 << 20,
        ..GpuLimits::default()
    });
    let l = SmLimits::from_gpu(&g).unwrap();
    assert_eq!(l.source, LimitsSource::Header);
    assert_eq!((l.max_warps_per_sm, l.max_blocks_per_sm), (48, 16));
    // Other compute capabilities need recorded limits; before 7.0 the units differ.
    g.limits = None;
    g.cc_major = 8;
    assert_eq!(SmLimits::from_gpu(&g), None);
    g.cc_major = 6;
    g.limits = Some(GpuLimits::default());
    assert_eq!(SmLimits::from_gpu(&g), None);
    // Nonsense limits (warp size 0) give none rather than a division by zero.
    g.cc_major = 9;
    assert_eq!(SmLimits::from_gpu(&g), None);
}
