//! Tests of the cubin reader on hand-built ELF images.
//!
//! Image layout built by [`elf`]:
//!
//! ```text
//! 0x00  ELF64 header (64 bytes): magic, class 2 (64-bit), data 1 (little endian),
//!       e_shoff @0x28, e_shentsize @0x3A = 64, e_shnum @0x3C, e_shstrndx @0x3E = 1
//! 0x40  section contents, one after the other, each padded to 8 bytes
//!       (section 1 is always .shstrtab, the section name table)
//! ...   section headers, 64 bytes each: sh_name @0, sh_type @4, sh_offset @24, sh_size @32,
//!       sh_link @40; header 0 is the null section
//! ```

use super::*;

const SHT_PROGBITS: u32 = 1;
const SHT_STRTAB: u32 = 3;
const SHT_CUDA_INFO: u32 = 0x7000_0000;

/// (name, type, link, contents) of the sections after the null and `.shstrtab` ones (which are
/// sections 0 and 1: `link` values count them).
type Sec = (&'static str, u32, u32, Vec<u8>);

fn elf(secs: &[Sec]) -> Vec<u8> {
    let mut shstrtab = vec![0u8];
    let mut name_at = Vec::new();
    for name in std::iter::once(".shstrtab").chain(secs.iter().map(|s| s.0)) {
        name_at.push(shstrtab.len() as u32);
        shstrtab.extend_from_slice(name.as_bytes());
        shstrtab.push(0);
    }
    let mut all: Vec<(u32, u32, u32, Vec<u8>)> = vec![(name_at[0], SHT_STRTAB, 0, shstrtab)];
    for (i, s) in secs.iter().enumerate() {
        all.push((name_at[i + 1], s.1, s.2, s.3.clone()));
    }
    let mut out = vec![0u8; 64];
    let mut placed = Vec::new();
    for (_, _, _, data) in &all {
        placed.push((out.len() as u64, data.len() as u64));
        out.extend_from_slice(data);
        while !out.len().is_multiple_of(8) {
            out.push(0);
        }
    }
    let shoff = out.len() as u64;
    out.extend_from_slice(&[0u8; 64]); // the null section
    for ((name, kind, link, _), (off, size)) in all.iter().zip(&placed) {
        let mut h = [0u8; 64];
        h[0..4].copy_from_slice(&name.to_le_bytes());
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[24..32].copy_from_slice(&off.to_le_bytes());
        h[32..40].copy_from_slice(&size.to_le_bytes());
        h[40..44].copy_from_slice(&link.to_le_bytes());
        out.extend_from_slice(&h);
    }
    out[0..4].copy_from_slice(b"\x7fELF");
    out[4] = 2;
    out[5] = 1;
    out[6] = 1;
    out[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
    out[0x34..0x36].copy_from_slice(&64u16.to_le_bytes());
    out[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
    out[0x3C..0x3E].copy_from_slice(&(all.len() as u16 + 1).to_le_bytes());
    out[0x3E..0x40].copy_from_slice(&1u16.to_le_bytes());
    out
}

/// A string table and the offsets of its names.
fn strtab(names: &[&str]) -> (Vec<u8>, Vec<u32>) {
    let mut t = vec![0u8];
    let mut at = Vec::new();
    for n in names {
        at.push(t.len() as u32);
        t.extend_from_slice(n.as_bytes());
        t.push(0);
    }
    (t, at)
}

/// A `.symtab`: the null symbol, then one 24-byte entry per name offset (only st_name is read).
fn symtab(name_offsets: &[u32]) -> Vec<u8> {
    let mut t = vec![0u8; SYM_SIZE];
    for &n in name_offsets {
        let mut e = [0u8; SYM_SIZE];
        e[0..4].copy_from_slice(&n.to_le_bytes());
        e[4] = 0x12; // STB_GLOBAL, STT_FUNC
        t.extend_from_slice(&e);
    }
    t
}

/// An EIFMT_SVAL record of u32 words.
fn sval(attr: u8, words: &[u32]) -> Vec<u8> {
    let mut r = vec![EIFMT_SVAL, attr];
    r.extend_from_slice(&((words.len() * 4) as u16).to_le_bytes());
    for w in words {
        r.extend_from_slice(&w.to_le_bytes());
    }
    r
}

const EIATTR_REGCOUNT: u8 = 0x2f;
const EIATTR_MIN_STACK_SIZE: u8 = 0x12;
const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;
const EIATTR_SW_WAR: u8 = 0x35;

/// A cubin of two kernels and a device function, laid out as nvcc lays them out: global
/// `.nv.info` with REGCOUNT / MAX_STACK / MIN_STACK / FRAME_SIZE per symbol, then a per-kernel
/// section with NVAL, HVAL and SVAL records.
pub(crate) fn two_kernels() -> Vec<u8> {
    let (strs, at) = strtab(&["_Z6spillsPfi", "_Z5cleanPf", "_Z6helperv"]);
    // Symbols 1, 2, 3.
    let mut info = Vec::new();
    for (sym, regs, stack, frame) in [(1u32, 64, 568, 568), (2, 16, 0, 0), (3, 24, 0, 40)] {
        info.extend(sval(EIATTR_REGCOUNT, &[sym, regs]));
        info.extend(sval(EIATTR_MAX_STACK_SIZE, &[sym, stack]));
        info.extend(sval(EIATTR_MIN_STACK_SIZE, &[sym, stack]));
        info.extend(sval(EIATTR_FRAME_SIZE, &[sym, frame]));
    }
    // Per-kernel: NVAL (4 bytes), HVAL (4 bytes), then an SVAL of 3 bytes (padded to 4).
    let mut own = vec![EIFMT_NVAL, EIATTR_SW_WAR, 0, 0];
    own.extend([EIFMT_HVAL, EIATTR_CBANK_PARAM_SIZE, 0x24, 0x00]);
    own.extend([EIFMT_SVAL, 0x50, 3, 0, 1, 2, 3, 0]);
    own.extend(sval(0x1c, &[0x50, 0x60]));
    elf(&[
        (".strtab", SHT_STRTAB, 0, strs),
        (".symtab", SHT_SYMTAB, 2, symtab(&at)), // link: .strtab is section 2
        (".nv.info", SHT_CUDA_INFO, 3, info),
        (".nv.info._Z6spillsPfi", SHT_CUDA_INFO, 3, own),
        (".text._Z6spillsPfi", SHT_PROGBITS, 3, vec![0; 32]),
    ])
}

fn f(name: &str, frame: Option<u32>, stack: Option<u32>) -> FunctionStack {
    FunctionStack {
        name: name.as_bytes().to_vec(),
        frame,
        stack,
    }
}

#[test]
fn frame_and_max_stack_per_symbol_from_the_global_nv_info() {
    assert_eq!(
        stack_sizes(&two_kernels()).unwrap(),
        vec![
            f("_Z5cleanPf", Some(0), Some(0)),
            f("_Z6helperv", Some(40), Some(0)),
            f("_Z6spillsPfi", Some(568), Some(568)),
        ]
    );
}

#[test]
fn records_of_every_format_are_walked_in_4_byte_steps() {
    let mut own = vec![EIFMT_NVAL, EIATTR_SW_WAR, 0, 0];
    own.extend([EIFMT_BVAL, 0x15, 7, 0]);
    own.extend([EIFMT_HVAL, EIATTR_CBANK_PARAM_SIZE, 0x24, 0x00]);
    own.extend([EIFMT_SVAL, 0x50, 3, 0, 1, 2, 3, 0]);
    own.extend(sval(EIATTR_FRAME_SIZE, &[96]));
    let got: Vec<(u8, u8, Vec<u8>)> = records(&own).map(|(f, a, v)| (f, a, v.to_vec())).collect();
    assert_eq!(
        got,
        vec![
            (EIFMT_NVAL, EIATTR_SW_WAR, vec![0, 0]),
            (EIFMT_BVAL, 0x15, vec![7, 0]),
            (EIFMT_HVAL, EIATTR_CBANK_PARAM_SIZE, vec![0x24, 0]),
            (EIFMT_SVAL, 0x50, vec![1, 2, 3]),
            (EIFMT_SVAL, EIATTR_FRAME_SIZE, vec![96, 0, 0, 0]),
        ]
    );
    // In a function's own section, a 4-byte FRAME_SIZE is that function's.
    let image = elf(&[(".nv.info._Z3fooi", SHT_CUDA_INFO, 0, own)]);
    assert_eq!(
        stack_sizes(&image).unwrap(),
        vec![f("_Z3fooi", Some(96), None)]
    );
}

#[test]
fn a_record_running_past_its_section_ends_the_walk() {
    let mut info = sval(EIATTR_FRAME_SIZE, &[1, 200]);
    info.extend([EIFMT_SVAL, EIATTR_FRAME_SIZE, 0xff, 0xff, 1, 0, 0, 0]);
    assert_eq!(records(&info).count(), 1);
    // An unknown format stops the walk too: the next record cannot be found.
    let mut info = vec![0x09, 0x01, 0, 0];
    info.extend(sval(EIATTR_FRAME_SIZE, &[1, 200]));
    assert_eq!(records(&info).count(), 0);
}

#[test]
fn unknown_symbols_and_short_values_are_skipped() {
    let (strs, at) = strtab(&["_Z1kv"]);
    let mut info = sval(EIATTR_FRAME_SIZE, &[1, 32]);
    info.extend(sval(EIATTR_FRAME_SIZE, &[99, 64])); // no symbol 99
    info.extend(sval(EIATTR_MAX_STACK_SIZE, &[0, 64])); // symbol 0 has no name
    info.extend(sval(EIATTR_MAX_STACK_SIZE, &[1])); // 4 bytes in the global section
    let image = elf(&[
        (".strtab", SHT_STRTAB, 0, strs),
        (".symtab", SHT_SYMTAB, 2, symtab(&at)),
        (".nv.info", SHT_CUDA_INFO, 3, info),
    ]);
    assert_eq!(
        stack_sizes(&image).unwrap(),
        vec![f("_Z1kv", Some(32), None)]
    );
}

#[test]
fn a_cubin_without_nv_info_has_no_functions() {
    let image = elf(&[(".text._Z1kv", SHT_PROGBITS, 0, vec![0; 16])]);
    assert_eq!(stack_sizes(&image).unwrap(), vec![]);
}

#[test]
fn images_that_are_not_elf64_cubins_are_refused() {
    let ptx = b"//\n// Generated by NVIDIA NVVM Compiler\n.version 8.5\n.target sm_90\n";
    assert_eq!(stack_sizes(ptx), Err(CubinError::NotElf));
    assert_eq!(stack_sizes(&[]), Err(CubinError::NotElf));
    let mut elf32 = two_kernels();
    elf32[4] = 1;
    assert_eq!(stack_sizes(&elf32), Err(CubinError::NotElf64));
    let mut big_endian = two_kernels();
    big_endian[5] = 2;
    assert_eq!(stack_sizes(&big_endian), Err(CubinError::NotElf64));
    let huge = vec![0u8; MAX_CUBIN_BYTES + 1];
    assert_eq!(stack_sizes(&huge), Err(CubinError::TooLarge));
}

#[test]
fn damaged_images_give_errors_not_panics() {
    let good = two_kernels();
    // Section headers past the end.
    let mut bad = good.clone();
    bad[0x28..0x30].copy_from_slice(&(good.len() as u64).to_le_bytes());
    assert!(matches!(stack_sizes(&bad), Err(CubinError::Malformed(_))));
    // A section's contents past the end.
    let mut bad = good.clone();
    let shoff = u64_at(&good, 0x28).unwrap() as usize;
    let sec3 = shoff + 3 * SHDR_SIZE;
    bad[sec3 + 32..sec3 + 40].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(stack_sizes(&bad), Err(CubinError::Malformed(_))));
    // Every truncation of a good image: an error or fewer functions, never a panic.
    for n in 0..good.len() {
        if let Ok(fs) = stack_sizes(&good[..n]) {
            assert!(fs.len() <= 3);
        }
    }
    // Every single-byte corruption likewise.
    for i in 0..good.len() {
        let mut b = good.clone();
        b[i] ^= 0xA5;
        let _ = stack_sizes(&b);
    }
}
