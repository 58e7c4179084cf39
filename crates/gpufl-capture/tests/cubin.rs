//! The cubin parser on a real module: `examples/kernel_pitfalls.cu` built on the H100 machine with
//! `nvcc -g -O2 -lineinfo -arch=sm_90` (CUDA 13.0) and extracted with `cuobjdump -xelf all`.
//! `cuobjdump -res-usage` on the same binary printed:
//!   _Z10small_gridPfi:       REG:10  STACK:0   SHARED:0 LOCAL:0
//!   _Z6spillsPKfPfi:         REG:64  STACK:568 SHARED:0 LOCAL:0
//!   _Z10regs_heavyPKfPfi:    REG:128 STACK:0   SHARED:0 LOCAL:0
//! and ptxas: `spills` has "568 bytes stack frame, 900 bytes spill stores, 900 bytes spill loads".
use gpufl_capture::modules::read_image;
use std::path::PathBuf;

#[test]
fn stack_frames_of_the_h100_cubin_match_cuobjdump() {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/cubin/kernel_pitfalls.sm_90.cubin");
    let image = std::fs::read(p).expect("testdata cubin");
    let funcs = read_image(&image).expect("a readable sm_90 cubin");
    let get = |name: &str| {
        funcs
            .iter()
            .find(|f| f.name == name.as_bytes())
            .unwrap_or_else(|| panic!("no {name} in {funcs:?}"))
    };
    let spills = get("_Z6spillsPKfPfi");
    assert_eq!(spills.frame, Some(568), "{spills:?}");
    assert!(spills.stack.is_none_or(|s| s >= 568), "{spills:?}");
    for k in ["_Z10small_gridPfi", "_Z10regs_heavyPKfPfi"] {
        let f = get(k);
        assert!(f.frame.unwrap_or(0) == 0, "{f:?}");
    }
    // Not a cubin: refused with a reason, never a panic.
    assert!(read_image(&image[..image.len() / 3]).is_err() || read_image(&image[..64]).is_err());
}
