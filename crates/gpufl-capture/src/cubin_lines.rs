//! Source lines of a cubin's SASS instructions, read from the DWARF line table that
//! `nvcc -lineinfo` (or `-G`) writes into the cubin.
//!
//! CUPTI's SASS metrics and PC sampling name an instruction by its function and its offset into
//! that function's `.text.<function>` section; [`LineTable::lookup`] turns that into the source
//! file and line.
//!
//! **Which section.** A `-lineinfo` cubin has two line programs, both DWARF line number programs
//! whose addresses are SASS offsets:
//!
//! - `.debug_line` maps SASS to the CUDA source: its file table names the `.cu` file (and headers)
//!   and its lines are source lines. This is the one read here.
//! - `.nv_debug_line_sass` maps SASS to lines of the embedded PTX text (`.nv_debug_ptx_txt`): its
//!   file table is empty and its lines run into the thousands. Not read here.
//!
//! (nvcc 12/13, `kernel_pitfalls.sm_90.cubin`: `.debug_line` is DWARF 2 with one directory and one
//! file, `kernel_pitfalls.cu`, and one sequence per kernel whose end address is the size of that
//! kernel's `.text` section.) Inlined code shows up as extra rows at the same address (nvcc marks
//! the switch with a vendor extended opcode, `0x90`, skipped here): the last row at an address
//! wins, which is the innermost (inlined) line.
//!
//! **Addresses.** Each sequence starts with `DW_LNE_set_address`, whose operand is relocated by
//! `.rela.debug_line`: an `Elf64_Rela` at the operand's offset in `.debug_line` naming the
//! function's symbol (or the `.text.<function>` section symbol) plus an addend. The symbol's
//! section is the sequence's `.text` section and `st_value + addend` the offset in it (for a
//! linked image, `st_value` is an address and the section's `sh_addr` is subtracted). Without a
//! relocation, the address is taken as an address in the one executable section whose
//! `[sh_addr, sh_addr + size)` holds it; a sequence that matches no section, or several, is
//! dropped.
//!
//! **Robustness.** Everything is bounds-checked and every count is bounded by the bytes that hold
//! it: a damaged image gives an error, never a panic, in time and memory linear in its size.

use std::collections::HashMap;

use crate::cubin::{self, CubinError, Section, SHT_SYMTAB, SYM_SIZE};

const SHT_RELA: u32 = 4;
const SHT_REL: u32 = 9;
const SHF_EXECINSTR: u64 = 0x4;
const SHF_COMPRESSED: u64 = 0x800;
const ET_REL: u16 = 1;
const STT_FUNC: u8 = 2;
const SHN_LORESERVE: u16 = 0xff00;

/// Row line meaning "no line here" (end of a sequence, or DWARF line 0).
const NO_LINE: u32 = 0;
/// File id of a row whose file index is not in the unit's file table.
const NO_FILE: u32 = u32::MAX;

/// Limits that keep a hostile table's memory small (real ones are far below): rows of all
/// sequences, entries of one directory or file table, and bytes of all file paths built (each
/// directory + name, counted before interning).
const MAX_ROWS: usize = 1 << 22;
const MAX_ENTRIES: u64 = 1 << 20;
const MAX_PATH_BYTES: usize = 16 << 20;

/// Why a cubin's line table was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CubinLinesError {
    #[error(transparent)]
    Elf(#[from] CubinError),
    #[error("compressed .debug_line is not supported")]
    Compressed,
    #[error("unsupported DWARF line table version {0}")]
    Version(u16),
    #[error("malformed .debug_line ({0})")]
    Malformed(&'static str),
}

type Result<T> = std::result::Result<T, CubinLinesError>;

fn bad(what: &'static str) -> CubinLinesError {
    CubinLinesError::Malformed(what)
}

/// One row of a `.text` section's table: from `addr` on (to the next row), the instruction is at
/// `files[file]:line`, or has no line when `line == NO_LINE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Row {
    addr: u64,
    file: u32,
    line: u32,
}

/// A function: its `.text` section, where it starts there, and its size (0: unknown).
#[derive(Debug, Clone, Copy)]
struct Function {
    section: usize,
    base: u64,
    size: u64,
}

/// SASS offset → source line of every function of a cubin.
#[derive(Debug, Clone, Default)]
pub struct LineTable {
    files: Vec<String>,
    /// Rows of each `.text` section (by section index), sorted by address, one per address.
    rows: HashMap<usize, Vec<Row>>,
    functions: HashMap<String, Function>,
    /// Functions whose section has rows, sorted.
    with_lines: Vec<String>,
}

impl LineTable {
    /// Reads the `.debug_line` table of a cubin. A cubin without one gives an empty table
    /// ([`has_lines`](Self::has_lines) false); an image that is not a readable ELF64, or whose
    /// line table is damaged, gives an error.
    pub fn parse(cubin: &[u8]) -> Result<LineTable> {
        let secs = cubin::sections(cubin)?;
        let linked = cubin::u16_at(cubin, 16) != Some(ET_REL);
        let functions = functions(&secs, linked);
        let mut table = LineTable {
            functions,
            ..LineTable::default()
        };
        let Some((index, line)) = secs
            .iter()
            .enumerate()
            .find(|(_, s)| s.name == b".debug_line")
        else {
            return Ok(table);
        };
        if line.flags & SHF_COMPRESSED != 0 {
            return Err(CubinLinesError::Compressed);
        }
        let named = |n: &[u8]| {
            secs.iter()
                .find(|s| s.name == n)
                .map_or(&[][..], |s| s.data)
        };
        let ctx = Ctx {
            relocs: relocations(&secs, index, linked),
            exec: secs
                .iter()
                .enumerate()
                .filter(|(_, s)| s.flags & SHF_EXECINSTR != 0)
                .map(|(i, s)| (i, s.addr, s.data.len() as u64))
                .collect(),
            debug_str: named(b".debug_str"),
            line_str: named(b".debug_line_str"),
        };
        let mut out = Builder::default();
        let mut pos = 0;
        while pos < line.data.len() {
            pos = unit(line.data, pos, &ctx, &mut out)?;
        }
        table.files = out.files;
        table.rows = out
            .rows
            .into_iter()
            .map(|(s, raw)| (s, finish(raw)))
            .filter(|(_, rows)| rows.iter().any(|r| r.line != NO_LINE))
            .collect();
        let mut with_lines: Vec<String> = table
            .functions
            .iter()
            .filter(|(_, f)| table.rows.contains_key(&f.section))
            .map(|(n, _)| n.clone())
            .collect();
        with_lines.sort();
        table.with_lines = with_lines;
        Ok(table)
    }

    /// Whether the cubin had a SASS line table with at least one line of a function.
    pub fn has_lines(&self) -> bool {
        !self.with_lines.is_empty()
    }

    /// Whether `function` (mangled name) has lines.
    pub fn has_lines_for(&self, function: &str) -> bool {
        self.functions
            .get(function)
            .is_some_and(|f| self.rows.contains_key(&f.section))
    }

    /// (file path, line) of the instruction at `pc_offset` bytes into the `.text` of `function`
    /// (mangled name as in the symbol table / `.text.<name>`). `None` for an unknown function, an
    /// offset past its end, or an instruction the table gives no line.
    pub fn lookup(&self, function: &str, pc_offset: u64) -> Option<(&str, u32)> {
        let f = self.functions.get(function)?;
        if f.size != 0 && pc_offset >= f.size {
            return None;
        }
        let addr = f.base.checked_add(pc_offset)?;
        let rows = self.rows.get(&f.section)?;
        let i = rows.partition_point(|r| r.addr <= addr).checked_sub(1)?;
        let row = rows.get(i)?;
        if row.line == NO_LINE {
            return None;
        }
        let file = self.files.get(row.file as usize)?;
        Some((file.as_str(), row.line))
    }

    /// The functions that have lines (mangled names), sorted.
    pub fn functions(&self) -> impl Iterator<Item = &str> {
        self.with_lines.iter().map(String::as_str)
    }
}

/// Functions of the image by name: `STT_FUNC` symbols, and `.text.<name>` sections without one.
fn functions(secs: &[Section<'_>], linked: bool) -> HashMap<String, Function> {
    let mut out = HashMap::new();
    if let Some(symtab) = secs.iter().find(|s| s.kind == SHT_SYMTAB) {
        let strtab = secs.get(symtab.link as usize).map_or(&[][..], |s| s.data);
        for sym in symtab.data.chunks_exact(SYM_SIZE) {
            let Some(s) = symbol(sym, strtab) else {
                continue;
            };
            let Some(sec) = secs.get(s.shndx) else {
                continue;
            };
            if s.kind != STT_FUNC || s.name.is_empty() {
                continue;
            }
            let base = if linked {
                s.value.wrapping_sub(sec.addr)
            } else {
                s.value
            };
            let name = String::from_utf8_lossy(s.name).into_owned();
            out.entry(name).or_insert(Function {
                section: s.shndx,
                base,
                size: s.size,
            });
        }
    }
    for (i, s) in secs.iter().enumerate() {
        if let Some(name) = s.name.strip_prefix(b".text.") {
            let name = String::from_utf8_lossy(name).into_owned();
            out.entry(name).or_insert(Function {
                section: i,
                base: 0,
                size: s.data.len() as u64,
            });
        }
    }
    out
}

struct Symbol<'a> {
    name: &'a [u8],
    kind: u8,
    /// Section index; `usize::MAX` for undefined / special indices.
    shndx: usize,
    value: u64,
    size: u64,
}

/// An `Elf64_Sym`.
fn symbol<'a>(sym: &[u8], strtab: &'a [u8]) -> Option<Symbol<'a>> {
    let name = cubin::c_str(strtab, cubin::u32_at(sym, 0)? as usize);
    let kind = sym.get(4)? & 0xf;
    let shndx = cubin::u16_at(sym, 6)?;
    let shndx = if shndx == 0 || shndx >= SHN_LORESERVE {
        usize::MAX
    } else {
        shndx as usize
    };
    let value = cubin::u64_at(sym, 8)?;
    let size = cubin::u64_at(sym, 16)?;
    Some(Symbol {
        name,
        kind,
        shndx,
        value,
        size,
    })
}

/// Where a relocated address points: `offset` into section `section`, plus the stored operand
/// when `add_stored` (`SHT_REL`, whose addend is the relocated field).
#[derive(Debug, Clone, Copy)]
struct Target {
    section: usize,
    offset: u64,
    add_stored: bool,
}

/// The relocations that apply to section `target`, by offset in it.
fn relocations(secs: &[Section<'_>], target: usize, linked: bool) -> HashMap<u64, Target> {
    let mut out = HashMap::new();
    for rel in secs.iter().filter(|s| s.info as usize == target) {
        let entry = match rel.kind {
            SHT_RELA => 24,
            SHT_REL => 16,
            _ => continue,
        };
        let Some(symtab) = secs.get(rel.link as usize).filter(|s| s.kind == SHT_SYMTAB) else {
            continue;
        };
        let strtab = secs.get(symtab.link as usize).map_or(&[][..], |s| s.data);
        for r in rel.data.chunks_exact(entry) {
            let (Some(offset), Some(info)) = (cubin::u64_at(r, 0), cubin::u64_at(r, 8)) else {
                continue;
            };
            let addend = if entry == 24 {
                cubin::u64_at(r, 16).unwrap_or(0)
            } else {
                0
            };
            let at = ((info >> 32) as usize).checked_mul(SYM_SIZE);
            let sym = at
                .and_then(|at| symtab.data.get(at..at.checked_add(SYM_SIZE)?))
                .and_then(|sym| symbol(sym, strtab));
            let Some(sym) = sym else { continue };
            let Some(sec) = secs.get(sym.shndx) else {
                continue;
            };
            let value = if linked {
                sym.value.wrapping_sub(sec.addr)
            } else {
                sym.value
            };
            out.insert(
                offset,
                Target {
                    section: sym.shndx,
                    offset: value.wrapping_add(addend),
                    add_stored: entry == 16,
                },
            );
        }
    }
    out
}

/// What the line programs need besides their own bytes.
struct Ctx<'a> {
    relocs: HashMap<u64, Target>,
    /// Executable sections: (index, sh_addr, size).
    exec: Vec<(usize, u64, u64)>,
    debug_str: &'a [u8],
    line_str: &'a [u8],
}

impl Ctx<'_> {
    /// The section and offset of a `DW_LNE_set_address` operand `stored` found at `at` in
    /// `.debug_line`.
    fn resolve(&self, at: usize, stored: u64) -> Option<(usize, u64)> {
        if let Some(t) = self.relocs.get(&(at as u64)) {
            let add = if t.add_stored { stored } else { 0 };
            return Some((t.section, t.offset.wrapping_add(add)));
        }
        let mut hits = self
            .exec
            .iter()
            .filter(|&&(_, addr, size)| stored >= addr && stored - addr < size);
        match (hits.next(), hits.next()) {
            (Some(&(i, addr, _)), None) => Some((i, stored - addr)),
            _ => None,
        }
    }
}

/// A row before sorting.
#[derive(Debug, Clone, Copy)]
struct RawRow {
    addr: u64,
    order: usize,
    end: bool,
    file: u32,
    line: u32,
}

#[derive(Default)]
struct Builder {
    files: Vec<String>,
    file_ids: HashMap<String, u32>,
    rows: HashMap<usize, Vec<RawRow>>,
    order: usize,
    path_bytes: usize,
}

impl Builder {
    /// `name` in `dir`, within the path budget.
    fn path(&mut self, dir: &[u8], name: &[u8]) -> Result<Vec<u8>> {
        self.path_bytes = self
            .path_bytes
            .saturating_add(dir.len())
            .saturating_add(name.len())
            .saturating_add(1);
        if self.path_bytes > MAX_PATH_BYTES {
            return Err(bad("file table too large"));
        }
        Ok(join(dir, name))
    }

    /// The id of file `name` in `dir`.
    fn file(&mut self, dir: &[u8], name: &[u8]) -> Result<u32> {
        let p = self.path(dir, name)?;
        Ok(self.intern(lossy(&p)))
    }

    fn intern(&mut self, path: String) -> u32 {
        if let Some(&id) = self.file_ids.get(&path) {
            return id;
        }
        let id = u32::try_from(self.files.len()).unwrap_or(NO_FILE);
        self.files.push(path.clone());
        self.file_ids.insert(path, id);
        id
    }
}

/// Sorts a section's rows by address and keeps one per address: the last emitted, and a row
/// that starts a sequence over the end of another.
fn finish(mut raw: Vec<RawRow>) -> Vec<Row> {
    raw.sort_by_key(|r| (r.addr, !r.end, r.order));
    let mut rows: Vec<Row> = Vec::with_capacity(raw.len());
    for r in raw {
        let row = Row {
            addr: r.addr,
            file: r.file,
            line: if r.end { NO_LINE } else { r.line },
        };
        match rows.last_mut() {
            Some(last) if last.addr == row.addr => *last = row,
            _ => rows.push(row),
        }
    }
    // Rows that repeat the previous one's line add nothing.
    rows.dedup_by(|next, prev| next.file == prev.file && next.line == prev.line);
    rows
}

/// A bounds-checked little-endian reader; positions are offsets in the whole section.
struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.data.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.bytes(1)?[0])
    }

    /// An unsigned little-endian integer of `n` (≤ 8) bytes.
    fn uint(&mut self, n: usize) -> Option<u64> {
        if n > 8 {
            return None;
        }
        let b = self.bytes(n)?;
        Some(b.iter().rev().fold(0u64, |v, &x| (v << 8) | u64::from(x)))
    }

    fn uleb(&mut self) -> Option<u64> {
        let mut v = 0u64;
        let mut shift = 0u32;
        loop {
            let b = self.u8()?;
            if shift < 64 {
                v |= u64::from(b & 0x7f) << shift;
            }
            shift = shift.saturating_add(7);
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
    }

    fn sleb(&mut self) -> Option<i64> {
        let mut v = 0i64;
        let mut shift = 0u32;
        loop {
            let b = self.u8()?;
            if shift < 64 {
                v |= i64::from(b & 0x7f) << shift;
            }
            shift = shift.saturating_add(7);
            if b & 0x80 == 0 {
                if shift < 64 && b & 0x40 != 0 {
                    v |= -1i64 << shift;
                }
                return Some(v);
            }
        }
    }

    /// A NUL-terminated string (without the NUL).
    fn cstr(&mut self) -> Option<&'a [u8]> {
        let rest = self.data.get(self.pos..)?;
        let n = rest.iter().position(|&c| c == 0)?;
        self.pos += n + 1;
        Some(&rest[..n])
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn is_absolute(p: &[u8]) -> bool {
    matches!(p.first(), Some(b'/' | b'\\'))
        || (p.len() >= 2 && p[0].is_ascii_alphabetic() && p[1] == b':')
}

/// `name` in directory `dir` (as is when absolute or `dir` is empty).
fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() || is_absolute(name) {
        return name.to_vec();
    }
    let mut p = dir.to_vec();
    if !matches!(p.last(), Some(b'/' | b'\\')) {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// A DWARF 5 entry attribute value.
enum Value<'a> {
    Str(&'a [u8]),
    Uint(u64),
    Other,
}

// DWARF 5 forms that may describe a directory or file entry.
const DW_FORM_BLOCK2: u64 = 0x03;
const DW_FORM_BLOCK4: u64 = 0x04;
const DW_FORM_DATA2: u64 = 0x05;
const DW_FORM_DATA4: u64 = 0x06;
const DW_FORM_DATA8: u64 = 0x07;
const DW_FORM_STRING: u64 = 0x08;
const DW_FORM_BLOCK: u64 = 0x09;
const DW_FORM_BLOCK1: u64 = 0x0a;
const DW_FORM_DATA1: u64 = 0x0b;
const DW_FORM_FLAG: u64 = 0x0c;
const DW_FORM_SDATA: u64 = 0x0d;
const DW_FORM_STRP: u64 = 0x0e;
const DW_FORM_UDATA: u64 = 0x0f;
const DW_FORM_FLAG_PRESENT: u64 = 0x19;
const DW_FORM_STRX: u64 = 0x1a;
const DW_FORM_DATA16: u64 = 0x1e;
const DW_FORM_LINE_STRP: u64 = 0x1f;
const DW_FORM_STRX1: u64 = 0x25;
const DW_FORM_STRX2: u64 = 0x26;
const DW_FORM_STRX3: u64 = 0x27;
const DW_FORM_STRX4: u64 = 0x28;
const DW_LNCT_PATH: u64 = 1;
const DW_LNCT_DIRECTORY_INDEX: u64 = 2;

fn form<'a>(r: &mut Reader<'a>, form: u64, off64: bool, ctx: &Ctx<'a>) -> Option<Value<'a>> {
    let offset = |r: &mut Reader<'a>| r.uint(if off64 { 8 } else { 4 });
    let strp = |table: &'a [u8], at: u64| {
        Value::Str(cubin::c_str(
            table,
            usize::try_from(at).unwrap_or(usize::MAX),
        ))
    };
    let skip = |r: &mut Reader<'a>, n: u64| {
        r.bytes(usize::try_from(n).ok()?)?;
        Some(Value::Other)
    };
    Some(match form {
        DW_FORM_STRING => Value::Str(r.cstr()?),
        DW_FORM_LINE_STRP => strp(ctx.line_str, offset(r)?),
        DW_FORM_STRP => strp(ctx.debug_str, offset(r)?),
        DW_FORM_DATA1 | DW_FORM_FLAG => Value::Uint(r.uint(1)?),
        DW_FORM_DATA2 => Value::Uint(r.uint(2)?),
        DW_FORM_DATA4 => Value::Uint(r.uint(4)?),
        DW_FORM_DATA8 => Value::Uint(r.uint(8)?),
        DW_FORM_UDATA => Value::Uint(r.uleb()?),
        DW_FORM_SDATA => Value::Uint(r.sleb()? as u64),
        DW_FORM_FLAG_PRESENT => Value::Other,
        DW_FORM_DATA16 => skip(r, 16)?,
        DW_FORM_BLOCK => {
            let n = r.uleb()?;
            skip(r, n)?
        }
        DW_FORM_BLOCK1 => {
            let n = r.uint(1)?;
            skip(r, n)?
        }
        DW_FORM_BLOCK2 => {
            let n = r.uint(2)?;
            skip(r, n)?
        }
        DW_FORM_BLOCK4 => {
            let n = r.uint(4)?;
            skip(r, n)?
        }
        // Indices into .debug_str_offsets, which needs the unit's base: no path.
        DW_FORM_STRX => {
            r.uleb()?;
            Value::Str(b"")
        }
        DW_FORM_STRX1 | DW_FORM_STRX2 | DW_FORM_STRX3 | DW_FORM_STRX4 => {
            r.bytes((form - DW_FORM_STRX1 + 1) as usize)?;
            Value::Str(b"")
        }
        _ => return None,
    })
}

/// DWARF 5 directory or file entries: (path, directory index) of each.
fn entries<'a>(r: &mut Reader<'a>, off64: bool, ctx: &Ctx<'a>) -> Result<Vec<(&'a [u8], u64)>> {
    let nformats = r.u8().ok_or(bad("entry formats"))?;
    let mut formats = Vec::with_capacity(nformats as usize);
    for _ in 0..nformats {
        let content = r.uleb().ok_or(bad("entry formats"))?;
        let f = r.uleb().ok_or(bad("entry formats"))?;
        formats.push((content, f));
    }
    let count = r.uleb().ok_or(bad("entry count"))?;
    // An entry takes at least one byte unless its format is empty: a larger count is damage.
    let left = r.data.len().saturating_sub(r.pos) as u64;
    if count > left || count > MAX_ENTRIES {
        return Err(bad("entry count"));
    }
    let mut out = Vec::new();
    for _ in 0..count {
        let (mut path, mut dir) = (&[][..], 0);
        for &(content, f) in &formats {
            match (content, form(r, f, off64, ctx).ok_or(bad("entry"))?) {
                (DW_LNCT_PATH, Value::Str(s)) => path = s,
                (DW_LNCT_DIRECTORY_INDEX, Value::Uint(v)) => dir = v,
                _ => {}
            }
        }
        out.push((path, dir));
    }
    Ok(out)
}

/// Line-program registers (the ones used here).
struct State {
    section: Option<usize>,
    address: u64,
    op_index: u64,
    file: u64,
    line: i64,
}

impl State {
    fn new() -> State {
        State {
            section: None,
            address: 0,
            op_index: 0,
            file: 1,
            line: 1,
        }
    }
}

/// Decodes the unit at `start` of `.debug_line` (`sec`); returns where the next one starts.
fn unit(sec: &[u8], start: usize, ctx: &Ctx<'_>, out: &mut Builder) -> Result<usize> {
    let (p, mut h) = unit_header(sec, start)?;
    let mut files = file_table(&mut h, &p, ctx, out)?;
    run_program(sec, &p, ctx, &mut files, out)?;
    // A sequence without DW_LNE_end_sequence is dropped.
    Ok(p.end)
}

/// What a unit's header says about its line program.
struct Program<'a> {
    version: u16,
    /// 64-bit DWARF (offsets of 8 bytes).
    off64: bool,
    /// Where the program starts, and where the unit ends.
    start: usize,
    end: usize,
    min_inst: u64,
    max_ops: u64,
    line_base: i64,
    line_range: u64,
    opcode_base: u8,
    /// Operand counts of the standard opcodes.
    std_lengths: &'a [u8],
}

/// The header of the unit at `start`, and a reader over the rest of the header (its directory
/// and file tables).
fn unit_header(sec: &[u8], start: usize) -> Result<(Program<'_>, Reader<'_>)> {
    let mut r = Reader {
        data: sec,
        pos: start,
    };
    let mut length = r.uint(4).ok_or(bad("unit length"))?;
    let off64 = length == 0xffff_ffff;
    if off64 {
        length = r.uint(8).ok_or(bad("unit length"))?;
    } else if length >= 0xffff_fff0 {
        return Err(bad("unit length"));
    }
    let end = usize::try_from(length)
        .ok()
        .and_then(|l| r.pos.checked_add(l))
        .filter(|&e| e <= sec.len())
        .ok_or(bad("unit length"))?;
    let mut r = Reader {
        data: &sec[..end],
        pos: r.pos,
    };
    let version = r.uint(2).ok_or(bad("header"))? as u16;
    if !(2..=5).contains(&version) {
        return Err(CubinLinesError::Version(version));
    }
    if version >= 5 {
        r.bytes(2).ok_or(bad("header"))?; // address_size, segment_selector_size
    }
    let header_length = r.uint(if off64 { 8 } else { 4 }).ok_or(bad("header"))?;
    let program = usize::try_from(header_length)
        .ok()
        .and_then(|l| r.pos.checked_add(l))
        .filter(|&p| p <= end)
        .ok_or(bad("header length"))?;
    let mut h = Reader {
        data: &sec[..program],
        pos: r.pos,
    };
    let min_inst = u64::from(h.u8().ok_or(bad("header"))?);
    let max_ops = if version >= 4 {
        u64::from(h.u8().ok_or(bad("header"))?.max(1))
    } else {
        1
    };
    let _default_is_stmt = h.u8().ok_or(bad("header"))?;
    let line_base = i64::from(h.u8().ok_or(bad("header"))? as i8);
    let line_range = h.u8().ok_or(bad("header"))?;
    let opcode_base = h.u8().ok_or(bad("header"))?;
    if line_range == 0 {
        return Err(bad("line_range 0"));
    }
    let line_range = u64::from(line_range);
    let std_lengths = h
        .bytes(usize::from(opcode_base.saturating_sub(1)))
        .ok_or(bad("header"))?;
    let p = Program {
        version,
        off64,
        start: program,
        end,
        min_inst,
        max_ops,
        line_base,
        line_range,
        opcode_base,
        std_lengths,
    };
    Ok((p, h))
}

/// A unit's files: interned paths, the index of the first (1 before DWARF 5), and the include
/// directories of DWARF 2-4 (for files the program defines).
struct Files<'a> {
    ids: Vec<u32>,
    base: u64,
    v4_dirs: Vec<&'a [u8]>,
}

/// The directory and file tables (`h` is at them) → interned paths.
fn file_table<'a>(
    h: &mut Reader<'a>,
    p: &Program<'_>,
    ctx: &Ctx<'a>,
    out: &mut Builder,
) -> Result<Files<'a>> {
    let mut v4_dirs: Vec<&[u8]> = Vec::new();
    if p.version >= 5 {
        let dirs = entries(h, p.off64, ctx)?;
        let comp = dirs.first().map_or(&[][..], |d| d.0);
        let dirs = dirs
            .iter()
            .enumerate()
            .map(|(i, d)| out.path(if i == 0 { &[] } else { comp }, d.0))
            .collect::<Result<Vec<Vec<u8>>>>()?;
        let ids = entries(h, p.off64, ctx)?
            .into_iter()
            .map(|(name, dir)| {
                let dir = usize::try_from(dir).ok().and_then(|d| dirs.get(d));
                out.file(dir.map_or(&[][..], |d| d), name)
            })
            .collect::<Result<Vec<u32>>>()?;
        return Ok(Files {
            ids,
            base: 0,
            v4_dirs,
        });
    }
    loop {
        let d = h.cstr().ok_or(bad("include directories"))?;
        if d.is_empty() {
            break;
        }
        v4_dirs.push(d);
        if v4_dirs.len() as u64 > MAX_ENTRIES {
            return Err(bad("include directories"));
        }
    }
    let mut ids = Vec::new();
    loop {
        let name = h.cstr().ok_or(bad("file names"))?;
        if name.is_empty() {
            break;
        }
        let dir = h.uleb().ok_or(bad("file names"))?;
        h.uleb().ok_or(bad("file names"))?;
        h.uleb().ok_or(bad("file names"))?;
        ids.push(file_v4(&v4_dirs, name, dir, out)?);
        if ids.len() as u64 > MAX_ENTRIES {
            return Err(bad("file names"));
        }
    }
    Ok(Files {
        ids,
        base: 1,
        v4_dirs,
    })
}

/// Runs the line program of `p` (in `sec`), adding the rows of each ended sequence to `out`.
fn run_program(
    sec: &[u8],
    p: &Program<'_>,
    ctx: &Ctx<'_>,
    files: &mut Files<'_>,
    out: &mut Builder,
) -> Result<()> {
    let end = p.end;
    let mut r = Reader {
        data: &sec[..end],
        pos: p.start,
    };
    let mut st = State::new();
    let mut seq: Vec<(usize, RawRow)> = Vec::new();
    let (opcode_base, line_range) = (p.opcode_base, p.line_range);
    let truncated = || bad("line program truncated");
    while r.pos < end {
        let op = r.u8().ok_or_else(truncated)?;
        if op == 0 {
            extended(sec, &mut r, p, ctx, &mut st, &mut seq, files, out)?;
        } else if op >= opcode_base {
            let adjusted = u64::from(op - opcode_base);
            advance(p, &mut st, adjusted / line_range);
            st.line = st
                .line
                .wrapping_add(p.line_base.wrapping_add((adjusted % line_range) as i64));
            emit(&mut seq, &st, false, &files.ids, files.base, out)?;
        } else {
            match op {
                1 => emit(&mut seq, &st, false, &files.ids, files.base, out)?,
                2 => {
                    let adv = r.uleb().ok_or_else(truncated)?;
                    advance(p, &mut st, adv);
                }
                3 => st.line = st.line.wrapping_add(r.sleb().ok_or_else(truncated)?),
                4 => st.file = r.uleb().ok_or_else(truncated)?,
                8 => advance(p, &mut st, u64::from(255 - opcode_base) / line_range),
                9 => {
                    let adv = r.uint(2).ok_or_else(truncated)?;
                    st.address = st.address.wrapping_add(adv);
                    st.op_index = 0;
                }
                // set_column, negate_stmt, basic_block, prologue_end, epilogue_begin, set_isa,
                // and unknown standard opcodes: skip their operands.
                _ => {
                    let n = p.std_lengths.get(usize::from(op) - 1).copied().unwrap_or(0);
                    for _ in 0..n {
                        r.uleb().ok_or_else(truncated)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Advance the address by `adv` operations (VLIW: `max_ops` per instruction).
fn advance(p: &Program<'_>, st: &mut State, adv: u64) {
    if p.max_ops == 1 {
        st.address = st.address.wrapping_add(p.min_inst.wrapping_mul(adv));
    } else {
        let ops = st.op_index.wrapping_add(adv);
        st.address = st
            .address
            .wrapping_add(p.min_inst.wrapping_mul(ops / p.max_ops));
        st.op_index = ops % p.max_ops;
    }
}

/// An extended opcode (after its 0 byte; `r` is at its length).
#[allow(clippy::too_many_arguments)]
fn extended(
    sec: &[u8],
    r: &mut Reader<'_>,
    p: &Program<'_>,
    ctx: &Ctx<'_>,
    st: &mut State,
    seq: &mut Vec<(usize, RawRow)>,
    files: &mut Files<'_>,
    out: &mut Builder,
) -> Result<()> {
    let truncated = || bad("line program truncated");
    let len = r.uleb().ok_or_else(truncated)?;
    let ext_end = usize::try_from(len)
        .ok()
        .and_then(|l| r.pos.checked_add(l))
        .filter(|&e| e <= p.end)
        .ok_or_else(truncated)?;
    if len == 0 {
        return Ok(());
    }
    match r.u8().ok_or_else(truncated)? {
        // DW_LNE_end_sequence
        1 => {
            emit(seq, st, true, &files.ids, files.base, out)?;
            for (s, row) in seq.drain(..) {
                out.rows.entry(s).or_default().push(row);
            }
            *st = State::new();
        }
        // DW_LNE_set_address
        2 => {
            let at = r.pos;
            let stored = r.uint(ext_end - at).ok_or(bad("set_address"))?;
            match ctx.resolve(at, stored) {
                Some((s, addr)) => {
                    st.section = Some(s);
                    st.address = addr;
                }
                None => st.section = None,
            }
            st.op_index = 0;
        }
        // DW_LNE_define_file (DWARF 2-4)
        3 if p.version < 5 => {
            let mut e = Reader {
                data: &sec[..ext_end],
                pos: r.pos,
            };
            let name = e.cstr().ok_or(bad("define_file"))?;
            let dir = e.uleb().ok_or(bad("define_file"))?;
            if files.ids.len() as u64 >= MAX_ENTRIES {
                return Err(bad("define_file"));
            }
            files.ids.push(file_v4(&files.v4_dirs, name, dir, out)?);
        }
        // DW_LNE_set_discriminator, vendor opcodes (nvcc's 0x90 for inlining): skipped.
        _ => {}
    }
    r.pos = ext_end;
    Ok(())
}

/// The interned path of a DWARF 2-4 file entry (`dir` 0: the compilation directory, unknown
/// here, so the name as is).
fn file_v4(dirs: &[&[u8]], name: &[u8], dir: u64, out: &mut Builder) -> Result<u32> {
    let d = usize::try_from(dir)
        .ok()
        .and_then(|d| d.checked_sub(1))
        .and_then(|d| dirs.get(d))
        .copied()
        .unwrap_or(&[]);
    out.file(d, name)
}

fn emit(
    seq: &mut Vec<(usize, RawRow)>,
    st: &State,
    end: bool,
    files: &[u32],
    file_base: u64,
    out: &mut Builder,
) -> Result<()> {
    let Some(section) = st.section else {
        return Ok(());
    };
    if out.order >= MAX_ROWS {
        return Err(bad("too many rows"));
    }
    let file = st
        .file
        .checked_sub(file_base)
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| files.get(i))
        .copied()
        .unwrap_or(NO_FILE);
    let line = u32::try_from(st.line).unwrap_or(NO_LINE);
    out.order += 1;
    seq.push((
        section,
        RawRow {
            addr: st.address,
            order: out.order,
            end,
            file,
            line,
        },
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pitfalls() -> Vec<u8> {
        let p = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../testdata/cubin/kernel_pitfalls.sm_90.cubin"
        );
        std::fs::read(p).expect("test cubin")
    }

    /// Parses, and looks a few PCs up when that worked: must not panic.
    fn exercise(image: &[u8]) -> Option<LineTable> {
        let t = LineTable::parse(image).ok()?;
        let names: Vec<String> = t.functions().map(str::to_string).collect();
        for f in names.iter().map(String::as_str).chain(["", "x"]) {
            for pc in [0, 0x10, 0x60, 0x4000, u64::MAX] {
                let _ = t.lookup(f, pc);
            }
        }
        Some(t)
    }

    /// Offset and size of a section of a real image (through the module's own ELF reader).
    fn section(image: &[u8], name: &[u8]) -> (usize, usize) {
        let secs = cubin::sections(image).unwrap();
        let s = secs.iter().find(|s| s.name == name).unwrap();
        let off = s.data.as_ptr() as usize - image.as_ptr() as usize;
        (off, s.data.len())
    }

    #[test]
    fn real_cubin() {
        let t = LineTable::parse(&pitfalls()).unwrap();
        assert!(t.has_lines());
        let names: Vec<&str> = t.functions().collect();
        assert_eq!(
            names,
            [
                "_Z10regs_heavyPKfPfi",
                "_Z10small_gridPfi",
                "_Z6spillsPKfPfi"
            ]
        );
        let (file, line) = t.lookup("_Z10small_gridPfi", 0).unwrap();
        assert!(file.ends_with("/kernel_pitfalls.cu"), "{file}");
        assert_eq!(line, 78);
        // One path for the whole file table.
        assert_eq!(t.files.len(), 1);
    }

    #[test]
    fn not_elf_and_empty() {
        assert_eq!(
            LineTable::parse(&[]).unwrap_err(),
            CubinLinesError::Elf(CubinError::NotElf)
        );
        assert_eq!(
            LineTable::parse(b"//\n// Generated by NVIDIA NVVM Compiler\n.version 8.0\n")
                .unwrap_err(),
            CubinLinesError::Elf(CubinError::NotElf)
        );
        assert!(LineTable::parse(b"\x7fELF").is_err());
        let t = LineTable::default();
        assert!(!t.has_lines());
        assert_eq!(t.lookup("k", 0), None);
    }

    #[test]
    fn without_line_sections() {
        // Rename .debug_line (and .nv_debug_line_sass) in the section name table.
        let mut img = pitfalls();
        for name in [&b".debug_line\0"[..], b".nv_debug_line_sass\0"] {
            let at = img
                .windows(name.len())
                .position(|w| w == name)
                .expect("section name");
            img[at + 1] = b'X';
        }
        let t = LineTable::parse(&img).unwrap();
        assert!(!t.has_lines());
        assert_eq!(t.functions().count(), 0);
        assert!(!t.has_lines_for("_Z10small_gridPfi"));
        assert_eq!(t.lookup("_Z10small_gridPfi", 0), None);
    }

    #[test]
    fn without_relocations_sequences_are_dropped() {
        // Three .text sections at address 0 and no relocation: no sequence can be placed.
        let mut img = pitfalls();
        let name = b".rela.debug_line\0";
        let at = img.windows(name.len()).position(|w| w == name).unwrap();
        img[at + 1] = b'X';
        // The relocation section still applies by sh_info: point it elsewhere (sh_info = 0).
        let secs = cubin::sections(&img).unwrap();
        let idx = secs
            .iter()
            .position(|s| s.name == b".Xela.debug_line")
            .unwrap();
        let shoff = cubin::u64_at(&img, 0x28).unwrap() as usize;
        img[shoff + idx * 64 + 44..shoff + idx * 64 + 48].copy_from_slice(&0u32.to_le_bytes());
        let t = LineTable::parse(&img).unwrap();
        assert!(!t.has_lines());
    }

    #[test]
    fn truncated_images_never_panic() {
        let img = pitfalls();
        for n in (0..img.len()).step_by(97) {
            exercise(&img[..n]);
        }
    }

    #[test]
    fn flipped_bytes_never_panic() {
        let img = pitfalls();
        // Every byte of the line table and its relocations, three ways.
        for sec in [&b".debug_line"[..], b".rela.debug_line", b".symtab"] {
            let (off, len) = section(&img, sec);
            for i in off..off + len {
                for x in [0xff, 0x80, 0x01] {
                    let mut m = img.clone();
                    m[i] ^= x;
                    exercise(&m);
                }
            }
        }
        // And bytes all over the image.
        let mut m = img.clone();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..3000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let i = (seed % m.len() as u64) as usize;
            m[i] ^= (seed >> 56) as u8 | 1;
            exercise(&m);
            if seed.is_multiple_of(8) {
                m.copy_from_slice(&img);
            }
        }
    }

    // ---- Synthetic images: DWARF 2-5 headers, relocations, paths.

    fn uleb(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn sleb(mut v: i64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if (v == 0 && b & 0x40 == 0) || (v == -1 && b & 0x40 != 0) {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    /// A line program, noting where each set_address operand is (offset in the program).
    #[derive(Default)]
    struct Prog {
        bytes: Vec<u8>,
        addresses: Vec<usize>,
    }

    impl Prog {
        fn set_address(&mut self, a: u64) -> &mut Self {
            self.bytes.extend([0, 9, 2]);
            self.addresses.push(self.bytes.len());
            self.bytes.extend(a.to_le_bytes());
            self
        }
        fn end(&mut self) -> &mut Self {
            self.bytes.extend([0, 1, 1]);
            self
        }
        fn copy(&mut self) -> &mut Self {
            self.bytes.push(1);
            self
        }
        fn advance_pc(&mut self, n: u64) -> &mut Self {
            self.bytes.push(2);
            uleb(n, &mut self.bytes);
            self
        }
        fn advance_line(&mut self, n: i64) -> &mut Self {
            self.bytes.push(3);
            sleb(n, &mut self.bytes);
            self
        }
        fn file(&mut self, n: u64) -> &mut Self {
            self.bytes.push(4);
            uleb(n, &mut self.bytes);
            self
        }
        /// A special opcode (opcode base 13, line base -5, line range 14).
        fn special(&mut self, addr: u8, line: i8) -> &mut Self {
            let op = (line as i16 + 5) as u8 + 14 * addr + 13;
            self.bytes.push(op);
            self
        }
        fn vendor(&mut self) -> &mut Self {
            self.bytes.extend([0, 3, 0x90, 3, 0]);
            self
        }
    }

    /// A line table unit: version, file/directory tables (already encoded), program. Returns
    /// the unit and the program's offset in it.
    fn unit_bytes(version: u16, tables: &[u8], prog: &[u8]) -> (Vec<u8>, usize) {
        let mut h = Vec::new();
        h.push(1); // min_inst_length
        if version >= 4 {
            h.push(1); // max_ops_per_inst
        }
        h.extend([1, (-5i8) as u8, 14, 13]);
        h.extend([0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1]);
        h.extend_from_slice(tables);
        let mut u = version.to_le_bytes().to_vec();
        if version >= 5 {
            u.extend([8, 0]);
        }
        u.extend((h.len() as u32).to_le_bytes());
        u.extend(h);
        let prog_at = 4 + u.len();
        u.extend_from_slice(prog);
        let mut out = (u.len() as u32).to_le_bytes().to_vec();
        out.extend(u);
        (out, prog_at)
    }

    struct Sec {
        name: &'static str,
        kind: u32,
        flags: u64,
        addr: u64,
        link: u32,
        info: u32,
        data: Vec<u8>,
    }

    fn sec(name: &'static str, kind: u32, data: Vec<u8>) -> Sec {
        Sec {
            name,
            kind,
            flags: 0,
            addr: 0,
            link: 0,
            info: 0,
            data,
        }
    }

    /// An ELF64 image of `secs` (section 0 and .shstrtab added: indices of `secs` start at 1).
    fn elf(e_type: u16, mut secs: Vec<Sec>) -> Vec<u8> {
        let mut shstr = vec![0u8];
        let mut names = vec![0u32];
        for s in &secs {
            names.push(shstr.len() as u32);
            shstr.extend(s.name.as_bytes());
            shstr.push(0);
        }
        names.push(shstr.len() as u32);
        shstr.extend(b".shstrtab\0");
        secs.push(sec(".shstrtab", 3, shstr));
        let mut img = vec![0u8; 64];
        img[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
        img[16..18].copy_from_slice(&e_type.to_le_bytes());
        img[18..20].copy_from_slice(&190u16.to_le_bytes());
        let mut offs = vec![0usize];
        for s in &secs {
            offs.push(img.len());
            img.extend(&s.data);
        }
        let shoff = img.len();
        img.extend([0u8; 64]);
        for (i, s) in secs.iter().enumerate() {
            let mut h = [0u8; 64];
            h[0..4].copy_from_slice(&names[i + 1].to_le_bytes());
            h[4..8].copy_from_slice(&s.kind.to_le_bytes());
            h[8..16].copy_from_slice(&s.flags.to_le_bytes());
            h[16..24].copy_from_slice(&s.addr.to_le_bytes());
            h[24..32].copy_from_slice(&(offs[i + 1] as u64).to_le_bytes());
            h[32..40].copy_from_slice(&(s.data.len() as u64).to_le_bytes());
            h[40..44].copy_from_slice(&s.link.to_le_bytes());
            h[44..48].copy_from_slice(&s.info.to_le_bytes());
            img.extend(h);
        }
        img[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        img[0x34..0x36].copy_from_slice(&64u16.to_le_bytes());
        img[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
        img[0x3C..0x3E].copy_from_slice(&(secs.len() as u16 + 1).to_le_bytes());
        img[0x3E..0x40].copy_from_slice(&(secs.len() as u16).to_le_bytes());
        img
    }

    fn sym(name: u32, info: u8, shndx: u16, value: u64, size: u64) -> Vec<u8> {
        let mut s = name.to_le_bytes().to_vec();
        s.extend([info, 0]);
        s.extend(shndx.to_le_bytes());
        s.extend(value.to_le_bytes());
        s.extend(size.to_le_bytes());
        s
    }

    /// Sections 1 .text.k1 (0x40), 2 .text.k2 (0x20), 3 .strtab, 4 .symtab (k1, k2), 5
    /// .debug_line, 6 .rela.debug_line (one per set_address, to k1 then k2 with `addends`),
    /// 7 .debug_line_str.
    fn image(line: Vec<u8>, operands: &[usize], addends: &[i64], line_str: Vec<u8>) -> Vec<u8> {
        let exec = |name, size| Sec {
            flags: 0x6,
            ..sec(name, 1, vec![0; size])
        };
        let mut syms = sym(0, 0, 0, 0, 0);
        syms.extend(sym(1, 0x12, 1, 0, 0x40));
        syms.extend(sym(4, 0x12, 2, 0, 0x20));
        let mut rela = Vec::new();
        for (i, (&at, &add)) in operands.iter().zip(addends).enumerate() {
            rela.extend((at as u64).to_le_bytes());
            rela.extend((((i as u64 % 2) + 1) << 32 | 2).to_le_bytes());
            rela.extend(add.to_le_bytes());
        }
        elf(
            1,
            vec![
                exec(".text.k1", 0x40),
                exec(".text.k2", 0x20),
                sec(".strtab", 3, b"\0k1\0k2\0".to_vec()),
                Sec {
                    link: 3,
                    ..sec(".symtab", 2, syms)
                },
                sec(".debug_line", 1, line),
                Sec {
                    link: 4,
                    info: 5,
                    ..sec(".rela.debug_line", 4, rela)
                },
                sec(".debug_line_str", 1, line_str),
            ],
        )
    }

    /// A DWARF 5 unit: directories "/comp" and "inc" (.debug_line_str), files a.cu (dir 0),
    /// /abs/b.h (dir 1), c.h (dir 1) with MD5s; k1: a.cu 10 at 0, 11 at 0x10, c.h:11 at 0x20 to
    /// 0x40; k2 (at addend 0x8): b.h 100 from 0 to 0x10.
    fn v5() -> (Vec<u8>, Vec<usize>, Vec<u8>) {
        let line_str = b"/comp\0inc\0".to_vec();
        let mut t = vec![1];
        uleb(1, &mut t); // DW_LNCT_path
        uleb(0x1f, &mut t); // DW_FORM_line_strp
        uleb(2, &mut t);
        t.extend(0u32.to_le_bytes());
        t.extend(6u32.to_le_bytes());
        t.push(3);
        t.extend([1, 0x08, 2, 0x0b, 5, 0x1e]); // path string, dir data1, MD5 data16
        uleb(3, &mut t);
        for (name, dir) in [(&b"a.cu"[..], 0u8), (b"/abs/b.h", 1), (b"c.h", 1)] {
            t.extend(name);
            t.push(0);
            t.push(dir);
            t.extend([0xAB; 16]);
        }
        let mut p = Prog::default();
        p.set_address(0).file(0).advance_line(9).copy();
        p.special(0x10, 1);
        p.vendor().file(2).advance_pc(0x10).copy();
        p.advance_pc(0x20).end();
        p.set_address(0).file(1).advance_line(99).copy();
        p.advance_pc(0x10).end();
        let (u, at) = unit_bytes(5, &t, &p.bytes);
        let ops = p.addresses.iter().map(|a| a + at).collect();
        (u, ops, line_str)
    }

    #[test]
    fn dwarf5_with_relocations_and_paths() {
        let (u, ops, ls) = v5();
        let t = LineTable::parse(&image(u, &ops, &[0, 0x8], ls)).unwrap();
        assert!(t.has_lines());
        assert_eq!(t.functions().collect::<Vec<_>>(), ["k1", "k2"]);
        assert_eq!(t.lookup("k1", 0), Some(("/comp/a.cu", 10)));
        assert_eq!(t.lookup("k1", 0xf), Some(("/comp/a.cu", 10)));
        assert_eq!(t.lookup("k1", 0x10), Some(("/comp/a.cu", 11)));
        assert_eq!(t.lookup("k1", 0x20), Some(("/comp/inc/c.h", 11)));
        assert_eq!(t.lookup("k1", 0x3f), Some(("/comp/inc/c.h", 11)));
        assert_eq!(t.lookup("k1", 0x40), None);
        // k2's sequence starts at its offset 8 (the addend): nothing before, nothing after 0x18.
        assert_eq!(t.lookup("k2", 0), None);
        assert_eq!(t.lookup("k2", 0x8), Some(("/abs/b.h", 100)));
        assert_eq!(t.lookup("k2", 0x17), Some(("/abs/b.h", 100)));
        assert_eq!(t.lookup("k2", 0x18), None);
        assert_eq!(t.lookup("k3", 0), None);
    }

    #[test]
    fn dwarf5_damage_never_panics() {
        let (u, ops, ls) = v5();
        let img = image(u, &ops, &[0, 0x8], ls);
        for n in 0..img.len() {
            exercise(&img[..n]);
        }
        for i in 0..img.len() {
            for x in [0xff, 0x80, 0x01, 0x40] {
                let mut m = img.clone();
                m[i] ^= x;
                exercise(&m);
            }
        }
    }

    #[test]
    fn huge_entry_count_is_refused() {
        // Zero entry formats and a count of 2^63: refused, not looped over.
        let mut t = vec![0];
        uleb(1 << 63, &mut t);
        t.push(0);
        uleb(0, &mut t);
        let (u, _) = unit_bytes(5, &t, &[]);
        let r = LineTable::parse(&image(u, &[], &[], Vec::new()));
        assert_eq!(r.unwrap_err(), CubinLinesError::Malformed("entry count"));
    }

    #[test]
    fn path_budget_is_enforced() {
        // A 1 MiB directory named by 20 files: 20 MiB of paths, refused before they are built.
        let mut t = vec![b'a'; 1 << 20];
        t.push(0);
        t.push(0);
        for _ in 0..20 {
            t.extend(b"f\0\x01\x00\x00");
        }
        t.push(0);
        let (u, _) = unit_bytes(2, &t, &[]);
        let r = LineTable::parse(&image(u, &[], &[], Vec::new()));
        assert_eq!(
            r.unwrap_err(),
            CubinLinesError::Malformed("file table too large")
        );
    }

    /// DWARF 2-4: include directory joined, file index from 1, DW_LNE_define_file.
    fn v2(version: u16) -> (Vec<u8>, Vec<usize>) {
        let mut t = b"/src/examples\0\0".to_vec();
        t.extend(b"k.cu\0\x01\x00\x00");
        t.extend(b"/usr/local/cuda/include/h.hpp\0\x00\x00\x00");
        t.push(0);
        let mut p = Prog::default();
        p.set_address(0).advance_line(4).copy(); // file 1 by default
        p.special(0x10, 2).file(2).special(0x10, -1);
        p.bytes.extend([0, 8, 3, b'd', b'.', b'h', 0, 1, 0, 0]); // define_file d.h in dir 1
        p.file(3).special(0x10, 0).end(); // k1: 5, 7, h.hpp 6, d.h 6, end 0x40
        let (u, at) = unit_bytes(version, &t, &p.bytes);
        (u, p.addresses.iter().map(|a| a + at).collect())
    }

    #[test]
    fn dwarf2_to_4() {
        for version in 2..=4 {
            let (u, ops) = v2(version);
            let t = LineTable::parse(&image(u, &ops, &[0], Vec::new())).unwrap();
            assert_eq!(
                t.lookup("k1", 0),
                Some(("/src/examples/k.cu", 5)),
                "v{version}"
            );
            assert_eq!(t.lookup("k1", 0x10), Some(("/src/examples/k.cu", 7)));
            assert_eq!(
                t.lookup("k1", 0x20),
                Some(("/usr/local/cuda/include/h.hpp", 6))
            );
            assert_eq!(t.lookup("k1", 0x30), Some(("/src/examples/d.h", 6)));
            assert_eq!(t.lookup("k1", 0x3f), Some(("/src/examples/d.h", 6)));
            assert!(!t.has_lines_for("k2"));
            assert_eq!(t.functions().collect::<Vec<_>>(), ["k1"]);
        }
    }

    #[test]
    fn unrelocated_address_in_one_exec_section() {
        // No relocation: the address 0x1010 falls in the one executable section at 0x1000.
        let (u, _) = v2(2);
        let mut u = u;
        // Patch the set_address operand (the only 8-byte zero run after opcode 0 9 2).
        let at = u.windows(3).position(|w| w == [0, 9, 2]).unwrap() + 3;
        u[at..at + 8].copy_from_slice(&0x1010u64.to_le_bytes());
        let mut syms = sym(0, 0, 0, 0, 0);
        syms.extend(sym(1, 0x12, 1, 0x1000, 0x40));
        let img = elf(
            2,
            vec![
                Sec {
                    flags: 0x6,
                    addr: 0x1000,
                    ..sec(".text.k1", 1, vec![0; 0x40])
                },
                sec(".strtab", 3, b"\0k1\0".to_vec()),
                Sec {
                    link: 2,
                    ..sec(".symtab", 2, syms)
                },
                sec(".debug_line", 1, u),
            ],
        );
        let t = LineTable::parse(&img).unwrap();
        assert_eq!(t.lookup("k1", 0), None);
        assert_eq!(t.lookup("k1", 0x10), Some(("/src/examples/k.cu", 5)));
        assert_eq!(t.lookup("k1", 0x20), Some(("/src/examples/k.cu", 7)));
    }

    #[test]
    fn bad_headers() {
        let (u, ops) = v2(2);
        let parse = |u: Vec<u8>| LineTable::parse(&image(u, &ops, &[0], Vec::new()));
        let mut m = u.clone();
        m[4] = 7; // version 7
        assert_eq!(parse(m).unwrap_err(), CubinLinesError::Version(7));
        let mut m = u.clone();
        m[4 + 2 + 4 + 3] = 0; // line_range 0
        assert_eq!(
            parse(m).unwrap_err(),
            CubinLinesError::Malformed("line_range 0")
        );
        let mut m = u.clone();
        m[0] = m[0].wrapping_add(1); // unit runs past the section
        assert!(parse(m).is_err());
        let mut m = u.clone();
        m.truncate(m.len() - 3); // no end_sequence: the sequence is dropped
        let n = m.len() as u32 - 4;
        m[..4].copy_from_slice(&n.to_le_bytes());
        assert!(!parse(m).unwrap().has_lines());
    }
}
