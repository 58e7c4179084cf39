//! gpufl's theoretical occupancy against the CUDA runtime's own
//! (`cudaOccupancyMaxActiveBlocksPerMultiprocessor`), as `examples/occupancy_check.cu` prints it
//! on the GPU: `testdata/occupancy/h100.jsonl` holds its output on the H100 (first line: the
//! device's limits; then one line per kernel, block size and dynamic shared memory).

use super::*;
use gpufl_analysis::occupancy::{occupancy, BlockUse};
use serde_json::Value;

fn h100_jsonl() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/occupancy/h100.jsonl")
}

/// The carveout a preference of `pct` % gives on compute capability 9.0: the preference's share
/// of the SM's shared memory rounded up to the next supported size (cuda_occupancy.h).
fn carveout_of(pct: i64, smem_per_sm: u64) -> u64 {
    const KIB: [u64; 10] = [0, 8, 16, 32, 64, 100, 132, 164, 196, 228];
    let want = pct as u64 * smem_per_sm / 100;
    KIB.iter()
        .map(|k| k * 1024)
        .find(|&b| b >= want)
        .unwrap_or(smem_per_sm)
}

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}"))
}

#[test]
fn occupancy_matches_the_cuda_runtime_on_h100() {
    let text = std::fs::read_to_string(h100_jsonl()).expect("testdata/occupancy/h100.jsonl");
    let mut lines = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON line"));
    let d = lines.next().expect("the device line");
    let gpu = Gpu {
        sm_count: u(&d, "sm_count") as u32,
        cc_major: u(&d, "cc_major") as u32,
        cc_minor: u(&d, "cc_minor") as u32,
        limits: Some(GpuLimits {
            max_threads_per_block: u(&d, "max_threads_per_block") as u32,
            max_threads_per_sm: u(&d, "max_threads_per_sm") as u32,
            max_blocks_per_sm: u(&d, "max_blocks_per_sm") as u32,
            regs_per_sm: u(&d, "regs_per_sm") as u32,
            regs_per_block: u(&d, "regs_per_block") as u32,
            smem_per_sm: u(&d, "smem_per_sm") as u32,
            smem_per_block: u(&d, "smem_per_block") as u32,
            smem_per_block_optin: u(&d, "smem_per_block_optin") as u32,
            smem_reserved_per_block: u(&d, "smem_reserved_per_block") as u32,
            warp_size: u(&d, "warp_size") as u32,
            l2_bytes: u(&d, "l2_bytes") as u32,
            ..GpuLimits::default()
        }),
        ..Gpu::default()
    };
    // The recorded limits agree with the published H100 figures the analysis falls back to.
    let l = SmLimits::from_gpu(&gpu).expect("limits");
    let published = SmLimits::h100();
    assert_eq!(
        (
            l.max_warps_per_sm,
            l.max_blocks_per_sm,
            l.regs_per_sm,
            l.smem_per_sm
        ),
        (
            published.max_warps_per_sm,
            published.max_blocks_per_sm,
            published.regs_per_sm,
            published.smem_per_sm
        )
    );
    assert_eq!(
        (l.smem_per_block_optin, l.smem_reserved_per_block),
        (
            published.smem_per_block_optin,
            published.smem_reserved_per_block
        )
    );
    let (mut checked, mut mismatches) = (0, Vec::new());
    for c in lines.filter(|c| c.get("kernel").is_some() && c.get("error").is_none()) {
        let smem = u(&c, "static_smem") + u(&c, "dyn_smem");
        let pref = c["carveout_pref"].as_i64().unwrap_or(-1);
        let carveout = (pref >= 0).then(|| carveout_of(pref, l.smem_per_sm as u64));
        // With a preference too small for one block the runtime picks the next size up, gpufl
        // (which reads the carveout the driver executed) the largest: not comparable.
        let alloc = (smem + l.smem_reserved_per_block as u64).div_ceil(128) * 128;
        if carveout.is_some_and(|c| c < alloc) {
            continue;
        }
        let o = occupancy(
            &l,
            BlockUse {
                threads: u(&c, "threads") as u32,
                regs: u(&c, "regs") as u32,
                smem: smem as u32,
                carveout: carveout.map(|c| c as u32),
            },
        )
        .expect("a block");
        checked += 1;
        if o.blocks_per_sm as u64 != u(&c, "blocks_per_sm") {
            mismatches.push(format!(
                "{c}: gpufl {} blocks ({:?})",
                o.blocks_per_sm, o.limited_by
            ));
        }
    }
    assert!(checked >= 100, "only {checked} cases");
    assert!(
        mismatches.is_empty(),
        "{} of {checked} differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}
