//! Stack sizes of a cubin's functions, read from NVIDIA's `.nv.info` attributes.
//!
//! CUDA's local memory size of a function (`CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`, CUPTI's
//! `localMemoryPerThread`) leaves out the ABI stack frame, where current compilers put register
//! spills: `nvcc --resource-usage` prints "568 bytes stack frame, 900 bytes spill stores" for a
//! kernel CUPTI reports 0 bytes of local memory for (`cuobjdump -res-usage` shows it as `STACK`,
//! not `LOCAL`). The frame is in the cubin, which CUPTI hands over when a module is loaded.
//!
//! **Layout** (ELF64, little endian). Section headers give the sections; `.nv.info` holds the
//! module-wide attributes, `.nv.info.<function>` a function's own. Each attribute is a record:
//!
//! ```text
//! u8 format, u8 attribute, then by format:
//!   EIFMT_NVAL (0x01): u16 unused                  (4 bytes in all)
//!   EIFMT_BVAL (0x02): u8 value, u8 padding        (4 bytes in all)
//!   EIFMT_HVAL (0x03): u16 value                   (4 bytes in all)
//!   EIFMT_SVAL (0x04): u16 size, then size bytes   (then padding to a multiple of 4)
//! ```
//!
//! In `.nv.info`, the per-function attributes read here are `EIFMT_SVAL` with 8 bytes: the
//! function's `.symtab` index (u32) and the value (u32):
//!
//! - `EIATTR_FRAME_SIZE` (0x11): the function's own frame, bytes per thread — what ptxas reports
//!   as "N bytes stack frame" (spill slots, local arrays, registers saved around calls);
//! - `EIATTR_MIN_STACK_SIZE` (0x12): not used here;
//! - `EIATTR_MAX_STACK_SIZE` (0x23): the stack the function needs with its callees (its frame plus
//!   the deepest chain of callee frames, as the linker sums it over the call graph). For a kernel
//!   that calls nothing it equals the frame. Which of the two `cuobjdump -res-usage` prints as
//!   `STACK` is for the device check to confirm (scripts/gpu-check.sh prints it beside the
//!   recording); the register-spill rule uses the frame, the kernel's own spill space.
//!
//! A 4-byte value of those attributes in a `.nv.info.<function>` section is taken as that
//! function's.
//!
//! **Sources** (the format is undocumented; these agree on every number used here):
//! cloudcores/CuAssembler `CuAsm/CuNVInfo.py` (formats 1–4, `0x1104` FRAME_SIZE, `0x1204`
//! MIN_STACK_SIZE, `0x2304` MAX_STACK_SIZE, 4-byte NVAL/HVAL records, and sample `.nv.info` bytes
//! `04 23 08 00 <sym> <value>`); the EIATTR enumerations in GVirtuS' `CudaRt_internal.h` and other
//! public headers (`EIATTR_FRAME_SIZE 0x11`, `EIATTR_MIN_STACK_SIZE 0x12`,
//! `EIATTR_MAX_STACK_SIZE 0x23`); a public `.nv.info` reader noting that records are padded to a
//! 4-byte boundary ("verified against real cubins with `cuobjdump -elf`"); and a write-up of
//! nvlink's finalization (MAX_STACK_SIZE is the sum of frame sizes along the deepest call path).
//!
//! Everything is bounds-checked: a damaged image gives an error or fewer functions, never a panic.

use std::collections::BTreeMap;

pub const EIFMT_NVAL: u8 = 0x01;
pub const EIFMT_BVAL: u8 = 0x02;
pub const EIFMT_HVAL: u8 = 0x03;
pub const EIFMT_SVAL: u8 = 0x04;
pub const EIATTR_FRAME_SIZE: u8 = 0x11;
pub const EIATTR_MAX_STACK_SIZE: u8 = 0x23;

/// Images larger than this are not parsed (the largest cubins of vendor libraries are a few MiB).
pub const MAX_CUBIN_BYTES: usize = 64 << 20;

pub(crate) const SHT_SYMTAB: u32 = 2;
const SHT_NOBITS: u32 = 8;
const SHDR_SIZE: usize = 64;
pub(crate) const SYM_SIZE: usize = 24;

/// One function's stack sizes, bytes per thread.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FunctionStack {
    /// Symbol name as in the cubin (mangled).
    pub name: Vec<u8>,
    /// `EIATTR_FRAME_SIZE`.
    pub frame: Option<u32>,
    /// `EIATTR_MAX_STACK_SIZE`.
    pub stack: Option<u32>,
}

/// Why an image was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CubinError {
    #[error("not an ELF image (PTX, or a fat binary)")]
    NotElf,
    #[error("not a 64-bit little-endian ELF")]
    NotElf64,
    #[error("larger than 64 MiB")]
    TooLarge,
    #[error("malformed ELF ({0})")]
    Malformed(&'static str),
}

pub(crate) fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// A NUL-terminated string at `at` of a string table (empty when out of bounds).
pub(crate) fn c_str(table: &[u8], at: usize) -> &[u8] {
    let rest = table.get(at..).unwrap_or(&[]);
    let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
    &rest[..end]
}

pub(crate) struct Section<'a> {
    pub(crate) name: &'a [u8],
    pub(crate) kind: u32,
    pub(crate) flags: u64,
    pub(crate) addr: u64,
    pub(crate) link: u32,
    pub(crate) info: u32,
    pub(crate) data: &'a [u8],
}

/// The section headers of an ELF64 little-endian image, with their names and contents.
pub(crate) fn sections(b: &[u8]) -> Result<Vec<Section<'_>>, CubinError> {
    if b.len() > MAX_CUBIN_BYTES {
        return Err(CubinError::TooLarge);
    }
    if b.get(..4) != Some(b"\x7fELF".as_slice()) {
        return Err(CubinError::NotElf);
    }
    if b.get(4) != Some(&2) || b.get(5) != Some(&1) {
        return Err(CubinError::NotElf64);
    }
    let bad = CubinError::Malformed;
    let shoff = u64_at(b, 0x28).ok_or(bad("header"))? as usize;
    let entsize = u16_at(b, 0x3A).ok_or(bad("header"))? as usize;
    let mut count = u16_at(b, 0x3C).ok_or(bad("header"))? as usize;
    let mut strndx = u16_at(b, 0x3E).ok_or(bad("header"))? as u32;
    if shoff == 0 {
        return Err(bad("no section headers"));
    }
    if entsize != SHDR_SIZE {
        return Err(bad("section header size"));
    }
    // Extended numbering: the real count / string table index are in section 0.
    if count == 0 {
        count = u64_at(b, shoff + 32).ok_or(bad("section 0"))? as usize;
    }
    if strndx == 0xFFFF {
        strndx = u32_at(b, shoff + 40).ok_or(bad("section 0"))?;
    }
    let table_end = count
        .checked_mul(SHDR_SIZE)
        .and_then(|n| n.checked_add(shoff))
        .filter(|&e| e <= b.len())
        .ok_or(bad("section headers out of bounds"))?;
    let mut out = Vec::with_capacity(count);
    let mut names = Vec::with_capacity(count);
    for h in (shoff..table_end).step_by(SHDR_SIZE) {
        let get32 = |o| u32_at(b, h + o).ok_or(bad("section header"));
        let get64 = |o| u64_at(b, h + o).ok_or(bad("section header"));
        let (name, kind, link, info) = (get32(0)? as usize, get32(4)?, get32(40)?, get32(44)?);
        let (flags, addr) = (get64(8)?, get64(16)?);
        let (off, size) = (get64(24)? as usize, get64(32)? as usize);
        let data = if kind == SHT_NOBITS {
            &[][..]
        } else {
            off.checked_add(size)
                .and_then(|end| b.get(off..end))
                .ok_or(bad("section out of bounds"))?
        };
        names.push(name);
        out.push(Section {
            name: &[],
            kind,
            flags,
            addr,
            link,
            info,
            data,
        });
    }
    let strtab = out
        .get(strndx as usize)
        .map(|s| s.data)
        .ok_or(bad("section name table"))?;
    for (s, n) in out.iter_mut().zip(names) {
        s.name = c_str(strtab, n);
    }
    Ok(out)
}

/// The attribute records of an `.nv.info` section: (format, attribute, value bytes). Stops at the
/// first record that does not fit or has an unknown format.
fn records(data: &[u8]) -> impl Iterator<Item = (u8, u8, &[u8])> {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        let head = data.get(pos..pos.checked_add(4)?)?;
        let (fmt, attr) = (head[0], head[1]);
        let (value, end) = match fmt {
            EIFMT_NVAL | EIFMT_BVAL | EIFMT_HVAL => (&head[2..4], pos + 4),
            EIFMT_SVAL => {
                let size = u16::from_le_bytes([head[2], head[3]]) as usize;
                let end = pos + 4 + size;
                (data.get(pos + 4..end)?, end)
            }
            _ => return None,
        };
        pos = end.checked_add(3)? & !3;
        Some((fmt, attr, value))
    })
}

/// Symbol name of `.symtab` entry `index`.
fn symbol<'a>(symtab: &Section<'a>, strtab: &'a [u8], index: u32) -> Option<&'a [u8]> {
    let at = (index as usize).checked_mul(SYM_SIZE)?;
    let name = u32_at(symtab.data, at)? as usize;
    Some(c_str(strtab, name)).filter(|n| !n.is_empty())
}

/// The stack sizes of every function of a cubin that has at least one, sorted by name.
pub fn stack_sizes(image: &[u8]) -> Result<Vec<FunctionStack>, CubinError> {
    let secs = sections(image)?;
    let symtab = secs.iter().find(|s| s.kind == SHT_SYMTAB);
    let strtab = symtab
        .and_then(|s| secs.get(s.link as usize))
        .map_or(&[][..], |s| s.data);
    let mut found: BTreeMap<&[u8], FunctionStack> = BTreeMap::new();
    for s in &secs {
        let own = if s.name == b".nv.info" {
            None
        } else if let Some(f) = s.name.strip_prefix(b".nv.info.") {
            Some(f)
        } else {
            continue;
        };
        for (fmt, attr, value) in records(s.data) {
            if fmt != EIFMT_SVAL || !matches!(attr, EIATTR_FRAME_SIZE | EIATTR_MAX_STACK_SIZE) {
                continue;
            }
            match (value.len(), own) {
                (4, Some(f)) => {
                    if let Some(v) = u32_at(value, 0) {
                        set(&mut found, f, attr, v);
                    }
                }
                (8.., _) => {
                    let named = symtab
                        .zip(u32_at(value, 0))
                        .and_then(|(t, i)| symbol(t, strtab, i));
                    if let (Some(name), Some(v)) = (named, u32_at(value, 4)) {
                        set(&mut found, name, attr, v);
                    }
                }
                _ => {}
            }
        }
    }
    Ok(found.into_values().collect())
}

/// Record one value (the largest, if a function has several).
fn set<'a>(found: &mut BTreeMap<&'a [u8], FunctionStack>, name: &'a [u8], attr: u8, v: u32) {
    let e = found.entry(name).or_insert_with(|| FunctionStack {
        name: name.to_vec(),
        ..FunctionStack::default()
    });
    let slot = if attr == EIATTR_FRAME_SIZE {
        &mut e.frame
    } else {
        &mut e.stack
    };
    *slot = Some(slot.map_or(v, |o| o.max(v)));
}

#[cfg(test)]
#[path = "cubin_tests.rs"]
pub(crate) mod tests;
