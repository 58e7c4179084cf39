//! Off-hot-path symbolization of raw code addresses of the *current* process.
//!
//! The recorder captures bare return addresses while the application runs; later
//! (a background thread, or at exit) a [`Symbolizer`] turns each distinct address
//! into `module + offset` and, where possible, `function / file / line`, with
//! inlined frames expanded.
//!
//! How it works:
//! * Loaded modules are enumerated with `dl_iterate_phdr`. Its `dlpi_addr` is the
//!   load bias (runtime address minus ELF virtual address), which is correct for
//!   PIE executables, shared objects and non-PIE executables (bias 0) alike. Each
//!   `PT_LOAD` segment becomes a `[start, end)` range; lookups are a binary search.
//!   The list is rescanned when an address falls outside every known module and
//!   glibc's load/unload counters (`dlpi_adds` / `dlpi_subs`) have changed.
//! * Per module, debug data is loaded lazily and exactly once through
//!   [`addr2line::Loader`] (mmap + DWARF context + symbol table). When the module
//!   itself has no `.debug_info`, a separate debug file is searched via build-id
//!   (`/usr/lib/debug/.build-id/xx/yyyy.debug`) and `.gnu_debuglink`, including a
//!   dwz supplementary file named by `.gnu_debugaltlink`.
//! * Without DWARF the ELF symbol table (`.symtab`, else `.dynsym`) provides the
//!   function name of the symbol covering the address.
//! * Results are cached per `(address, is_return_address)`.
//!
//! Nothing here panics on bad input: failures degrade to less information, and
//! [`Symbolizer::resolve`] additionally catches unwinding panics from the parsing
//! crates (malformed debug info) and reports an unknown frame instead.

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use addr2line::Loader;
use object::{Object, ObjectSection};

/// Upper bound on inline depth we expand (guards against corrupt DWARF).
const MAX_INLINE_DEPTH: usize = 128;
/// Root of the system separate-debug-info tree.
const DEBUG_ROOT: &str = "/usr/lib/debug";

/// One symbolized frame. A single address may yield several (inlined) frames.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SymFrame {
    /// Full path of the shared object / executable the address belongs to
    /// (the main executable is reported as the target of `/proc/self/exe`);
    /// `"?"` when the address is in no loaded module.
    pub module: String,
    /// Address relative to the module's load base: the file-relative virtual
    /// address ("svma") that was looked up (already minus 1 for return addresses).
    /// For unknown addresses, the raw address.
    pub module_offset: u64,
    /// Demangled function name (C++ via `cpp_demangle`, Rust via `rustc_demangle`
    /// without the hash suffix), from DWARF or else from the ELF symbol table.
    pub function: Option<String>,
    /// Source file as recorded in DWARF (joined with the compilation directory
    /// when relative).
    pub file: Option<String>,
    /// Source line number, if known.
    pub line: Option<u32>,
    /// `true` for frames that were inlined into the next (outer) frame.
    pub inlined: bool,
}

impl SymFrame {
    /// The frame reported for an address in no known module.
    fn unknown(addr: u64) -> Self {
        SymFrame {
            module: "?".to_string(),
            module_offset: addr,
            function: None,
            file: None,
            line: None,
            inlined: false,
        }
    }
}

/// A loaded module as reported by the dynamic loader.
struct Module {
    /// Path reported in [`SymFrame::module`].
    path: String,
    /// Path to open for reading the ELF file; `None` when there is no file
    /// (e.g. the vDSO).
    open_path: Option<PathBuf>,
    /// Load bias: runtime address = ELF virtual address + bias.
    bias: u64,
}

impl Module {
    /// The frame of `probe` (an address in this module) by module and offset only.
    fn frame(&self, probe: u64) -> SymFrame {
        SymFrame {
            module: self.path.clone(),
            module_offset: probe.wrapping_sub(self.bias),
            function: None,
            file: None,
            line: None,
            inlined: false,
        }
    }
}

/// The address looked up for `addr`: a return address's call instruction lies before it.
fn probe_of(addr: u64, is_return_address: bool) -> u64 {
    if is_return_address {
        addr.saturating_sub(1)
    } else {
        addr
    }
}

/// One `PT_LOAD` segment in runtime addresses, pointing into `Symbolizer::modules`.
struct Segment {
    start: u64,
    end: u64,
    module: usize,
}

/// Lazily loaded debug data of one module: the loaders to consult, best first.
/// Typically either `[module]` (DWARF in the file itself) or
/// `[separate debug file, module]`; empty when nothing could be loaded.
struct ModuleDebug {
    sources: Vec<Loader>,
}

/// Resolves absolute addresses of the current process to symbolized frames.
///
/// Keeps caches for the module list, each module's debug data (loaded on first
/// use and kept for the lifetime of the `Symbolizer`), and every resolved
/// address. Intended to be used off the hot path; one instance per thread.
pub struct Symbolizer {
    modules: Vec<Module>,
    /// Sorted by `start`, non-overlapping.
    segments: Vec<Segment>,
    /// `(dlpi_adds, dlpi_subs)` at the time of the last scan.
    generation: Option<(u64, u64)>,
    scanned: bool,
    /// Debug data keyed by module path.
    debug: HashMap<String, ModuleDebug>,
    cache: HashMap<(u64, bool), Vec<SymFrame>>,
    /// Until then, a module with more than [`LARGE_SYMBOL_BYTES`] of symbol data is not loaded:
    /// its frames are module and offset only, and not cached ([`Symbolizer::defer_large`]).
    defer_large_until: Option<std::time::Instant>,
    /// Modules found large while deferring (by path).
    large: HashMap<String, bool>,
    /// The bound of "large" (bytes of symbol data).
    large_bytes: u64,
}

/// A module whose symbol tables, strings and DWARF exceed this is "large" (libtorch's libraries:
/// tens of MB of exported C++ names) for [`Symbolizer::defer_large`].
pub const LARGE_SYMBOL_BYTES: u64 = 4 << 20;

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// Creates an empty symbolizer. Cheap: modules are enumerated on the first
    /// [`resolve`](Self::resolve) and debug data is loaded per module on demand.
    pub fn new() -> Self {
        Symbolizer {
            modules: Vec::new(),
            segments: Vec::new(),
            generation: None,
            scanned: false,
            debug: HashMap::new(),
            cache: HashMap::new(),
            defer_large_until: None,
            large: HashMap::new(),
            large_bytes: LARGE_SYMBOL_BYTES,
        }
    }

    /// Until `until`, leave large modules' debug data unloaded (their frames: module and offset,
    /// [`Symbolizer::resolve_now`] says they are provisional). Loading a large library's symbol
    /// tables on the writer thread slows the program's own threads while it runs (~0.1 s of a
    /// PyTorch program's first step, docs/benchmarks.md): always-on puts it past its start.
    pub fn defer_large(&mut self, until: std::time::Instant) {
        self.defer_over(until, LARGE_SYMBOL_BYTES);
    }

    /// [`Symbolizer::defer_large`] with another bound of a large module's symbol data (bytes).
    pub fn defer_over(&mut self, until: std::time::Instant, bytes: u64) {
        self.defer_large_until = Some(until);
        self.large_bytes = bytes;
        self.large.clear();
    }

    /// Symbolizes `addr`, an absolute address in this process.
    ///
    /// `is_return_address` must be `true` for every frame except the innermost
    /// one; `addr - 1` is then looked up so that the call instruction (not the
    /// instruction after it) provides the line.
    ///
    /// Returns frames innermost-first: inlined frames first (`inlined: true`),
    /// the outermost real function last (`inlined: false`). Never empty: an
    /// address in no known module yields one frame with module `"?"`,
    /// `module_offset == addr` and no function. Results are cached, so repeated
    /// lookups of the same address are a hash-map hit plus a clone.
    pub fn resolve(&mut self, addr: u64, is_return_address: bool) -> Vec<SymFrame> {
        self.resolve_now(addr, is_return_address).0
    }

    /// [`Symbolizer::resolve`], and whether the answer is final: false for a frame of a large
    /// module while its loading is deferred ([`Symbolizer::defer_large`]), which is module and
    /// offset only and not cached (the same address resolves fully once the deferral ends).
    pub fn resolve_now(&mut self, addr: u64, is_return_address: bool) -> (Vec<SymFrame>, bool) {
        let key = (addr, is_return_address);
        if let Some(frames) = self.cache.get(&key) {
            return (frames.clone(), true);
        }
        if self
            .defer_large_until
            .is_some_and(|t| std::time::Instant::now() < t)
        {
            let deferred =
                catch_unwind(AssertUnwindSafe(|| self.deferred(addr, is_return_address)));
            if let Ok(Some(frame)) = deferred {
                return (vec![frame], false);
            }
        }
        let frames = catch_unwind(AssertUnwindSafe(|| {
            self.resolve_uncached(addr, is_return_address)
        }))
        .ok()
        .filter(|f| !f.is_empty())
        .unwrap_or_else(|| vec![SymFrame::unknown(addr)]);
        self.cache.insert(key, frames.clone());
        (frames, true)
    }

    /// While deferring: the module-and-offset frame of `addr` when its module is large and not
    /// loaded yet; None when it may be resolved now.
    fn deferred(&mut self, addr: u64, is_return_address: bool) -> Option<SymFrame> {
        let probe = probe_of(addr, is_return_address);
        let idx = self.find_module(probe)?;
        let module = self.modules.get(idx)?;
        if self.debug.contains_key(&module.path) {
            return None;
        }
        let large = match self.large.get(&module.path) {
            Some(&l) => l,
            None => {
                let l = module
                    .open_path
                    .as_deref()
                    .and_then(inspect)
                    .is_some_and(|i| i.symbol_bytes > self.large_bytes);
                self.large.insert(module.path.clone(), l);
                l
            }
        };
        large.then(|| self.modules[idx].frame(probe))
    }

    /// The module and offset of `addr` only: no debug data or symbol table is loaded (the
    /// benchmark knob `GPUFL_SYMBOLIZE=0`).
    pub fn locate(&mut self, addr: u64, is_return_address: bool) -> SymFrame {
        let probe = probe_of(addr, is_return_address);
        match self.find_module(probe).and_then(|i| self.modules.get(i)) {
            Some(m) => m.frame(probe),
            None => SymFrame::unknown(addr),
        }
    }

    fn resolve_uncached(&mut self, addr: u64, is_return_address: bool) -> Vec<SymFrame> {
        let probe = probe_of(addr, is_return_address);
        let Some(idx) = self.find_module(probe) else {
            return vec![SymFrame::unknown(addr)];
        };
        let Some(module) = self.modules.get(idx) else {
            return vec![SymFrame::unknown(addr)];
        };
        let svma = probe.wrapping_sub(module.bias);
        let debug = self
            .debug
            .entry(module.path.clone())
            .or_insert_with(|| ModuleDebug::load(module.open_path.as_deref()));
        let mut frames = debug.frames(&module.path, svma);
        let outer_needs_name = frames.last().is_none_or(|f| f.function.is_none());
        if outer_needs_name {
            let function = debug.symbol(svma);
            match frames.last_mut() {
                Some(last) => last.function = function,
                None => frames.push(SymFrame {
                    function,
                    ..module.frame(probe)
                }),
            }
        }
        frames
    }

    /// Index of the module containing `addr`, rescanning the module list if the
    /// address is unknown and the set of loaded objects may have changed.
    fn find_module(&mut self, addr: u64) -> Option<usize> {
        if self.scanned {
            if let Some(i) = self.lookup_segment(addr) {
                return Some(i);
            }
        }
        let generation = current_generation();
        let changed = generation.is_none() || generation != self.generation;
        if self.scanned && !changed {
            return None;
        }
        // Something was unloaded: cached results may describe stale mappings.
        if self.scanned && generation.map(|g| g.1) != self.generation.map(|g| g.1) {
            self.cache.clear();
        }
        self.rescan();
        self.generation = generation;
        self.lookup_segment(addr)
    }

    fn lookup_segment(&self, addr: u64) -> Option<usize> {
        let i = self.segments.partition_point(|s| s.start <= addr);
        let seg = self.segments.get(i.checked_sub(1)?)?;
        (addr < seg.end).then_some(seg.module)
    }

    /// Re-enumerates loaded modules with `dl_iterate_phdr`.
    fn rescan(&mut self) {
        let mut raw: Vec<RawModule> = Vec::new();
        // SAFETY: the callback only reads the loader-provided struct and pushes
        // into the Vec passed through `data`, which outlives the call.
        unsafe {
            crate::dl::iterate_phdr(collect_module, (&mut raw as *mut Vec<RawModule>).cast());
        }
        let exe = std::fs::read_link("/proc/self/exe").ok();
        self.modules.clear();
        self.segments.clear();
        for (n, m) in raw.into_iter().enumerate() {
            let (path, open_path) = if m.name.is_empty() {
                if n != 0 {
                    continue; // nameless non-main entry: nothing we can read
                }
                let shown = exe
                    .as_ref()
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "/proc/self/exe".to_string());
                // Opening /proc/self/exe works even if the file was replaced.
                (shown, Some(PathBuf::from("/proc/self/exe")))
            } else {
                let file = Path::new(&m.name);
                let open = file.is_file().then(|| file.to_path_buf());
                (m.name, open)
            };
            let module = self.modules.len();
            for (start, end) in m.segments {
                self.segments.push(Segment { start, end, module });
            }
            self.modules.push(Module {
                path,
                open_path,
                bias: m.bias,
            });
        }
        self.segments.sort_unstable_by_key(|s| s.start);
        self.scanned = true;
    }
}

/// Module data copied out of a `dl_phdr_info`.
struct RawModule {
    name: String,
    bias: u64,
    segments: Vec<(u64, u64)>,
}

/// `dl_iterate_phdr` callback collecting every module. Must not panic.
// `u64::from` on the ELF header fields keeps this correct for Elf32 on 32-bit targets.
#[allow(clippy::useless_conversion)]
unsafe extern "C" fn collect_module(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: `data` is the `&mut Vec<RawModule>` passed by `rescan`, `info` is
    // valid for the duration of the callback per the dl_iterate_phdr contract.
    let (Some(out), Some(info)) = (unsafe { data.cast::<Vec<RawModule>>().as_mut() }, unsafe {
        info.as_ref()
    }) else {
        return 0;
    };
    let name = if info.dlpi_name.is_null() {
        String::new()
    } else {
        // SAFETY: non-null, NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }
            .to_string_lossy()
            .into_owned()
    };
    let bias = info.dlpi_addr;
    let mut segments = Vec::new();
    if !info.dlpi_phdr.is_null() {
        for i in 0..usize::from(info.dlpi_phnum) {
            // SAFETY: the loader guarantees `dlpi_phnum` headers at `dlpi_phdr`.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type == libc::PT_LOAD && ph.p_memsz > 0 {
                let start = bias.wrapping_add(u64::from(ph.p_vaddr));
                segments.push((start, start.saturating_add(u64::from(ph.p_memsz))));
            }
        }
    }
    out.push(RawModule {
        name,
        bias,
        segments,
    });
    0
}

/// `dl_iterate_phdr` callback reading the load/unload counters of the first entry.
unsafe extern "C" fn read_generation(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: see `collect_module`; `data` is an `Option<(u64, u64)>`.
    if let (Some(out), Some(info)) = (
        unsafe { data.cast::<Option<(u64, u64)>>().as_mut() },
        unsafe { info.as_ref() },
    ) {
        *out = Some((info.dlpi_adds, info.dlpi_subs));
    }
    1 // stop after the first module
}

/// `(number of objects ever loaded, number ever unloaded)`; `None` if unavailable.
fn current_generation() -> Option<(u64, u64)> {
    let mut generation: Option<(u64, u64)> = None;
    // SAFETY: the callback writes only through the pointer to `generation`.
    unsafe {
        crate::dl::iterate_phdr(
            read_generation,
            (&mut generation as *mut Option<(u64, u64)>).cast(),
        );
    }
    generation
}

impl ModuleDebug {
    /// Loads debug data for the ELF file at `path` (nothing if `None` or on error).
    fn load(path: Option<&Path>) -> Self {
        let mut sources = Vec::new();
        let Some(path) = path else {
            return ModuleDebug { sources };
        };
        let info = inspect(path);
        if !info.as_ref().is_some_and(|i| i.has_dwarf) {
            // No DWARF in the module itself: try a separate debug file first.
            if let Some(dbg) = info.as_ref().and_then(|i| find_debug_file(path, i)) {
                let sup = inspect(&dbg).and_then(|i| i.altlink);
                let loaded = match &sup {
                    Some(sup) => {
                        Loader::new_with_sup(&dbg, Some(sup)).or_else(|_| Loader::new(&dbg))
                    }
                    None => Loader::new(&dbg),
                };
                sources.extend(loaded.ok());
            }
        }
        // The module itself: DWARF if present, and its symbol table either way.
        let sup = info.and_then(|i| i.altlink);
        let loaded = match &sup {
            Some(sup) => Loader::new_with_sup(path, Some(sup)).or_else(|_| Loader::new(path)),
            None => Loader::new(path),
        };
        sources.extend(loaded.ok());
        ModuleDebug { sources }
    }

    /// DWARF frames (innermost first) from the first source that knows `svma`.
    fn frames(&self, module: &str, svma: u64) -> Vec<SymFrame> {
        let mut out = Vec::new();
        for loader in &self.sources {
            let Ok(mut iter) = loader.find_frames(svma) else {
                continue;
            };
            while out.len() < MAX_INLINE_DEPTH {
                let Ok(Some(frame)) = iter.next() else { break };
                let function = frame
                    .function
                    .as_ref()
                    .and_then(|f| f.raw_name().ok())
                    .map(|raw| demangle(&raw));
                let (file, line) = frame
                    .location
                    .map(|l| (l.file.map(str::to_string), l.line))
                    .unwrap_or((None, None));
                out.push(SymFrame {
                    module: module.to_string(),
                    module_offset: svma,
                    function,
                    file,
                    line,
                    inlined: true,
                });
            }
            if let Some(last) = out.last_mut() {
                last.inlined = false;
                return out;
            }
        }
        out
    }

    /// Demangled name of the symbol-table entry covering `svma`.
    fn symbol(&self, svma: u64) -> Option<String> {
        self.sources
            .iter()
            .find_map(|l| l.find_symbol(svma))
            .map(demangle)
    }
}

/// What we need to know about an ELF file before loading it.
struct FileInfo {
    has_dwarf: bool,
    /// Bytes of the symbol tables, their strings and the DWARF sections: what loading the
    /// module's debug data reads.
    symbol_bytes: u64,
    build_id: Option<Vec<u8>>,
    debuglink: Option<String>,
    /// dwz supplementary file (`.gnu_debugaltlink`), resolved to a path.
    altlink: Option<PathBuf>,
}

/// Reads section/note metadata of the ELF file at `path`.
fn inspect(path: &Path) -> Option<FileInfo> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: read-only private mapping; the file is a loaded module or a debug
    // file that is not expected to be truncated while we read it.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let obj = object::File::parse(&*map).ok()?;
    let has_dwarf = obj
        .section_by_name(".debug_info")
        .is_some_and(|s| s.size() > 0);
    let symbol_bytes = obj
        .sections()
        .filter(|s| {
            s.name().is_ok_and(|n| {
                matches!(n, ".symtab" | ".strtab" | ".dynsym" | ".dynstr")
                    || n.starts_with(".debug_")
            })
        })
        .map(|s| s.size())
        .sum();
    let build_id = obj.build_id().ok().flatten().map(<[u8]>::to_vec);
    let debuglink = obj
        .gnu_debuglink()
        .ok()
        .flatten()
        .map(|(name, _crc)| String::from_utf8_lossy(name).into_owned());
    let altlink = obj
        .gnu_debugaltlink()
        .ok()
        .flatten()
        .and_then(|(name, id)| {
            let name = Path::new(std::str::from_utf8(name).ok()?);
            let by_name = if name.is_absolute() {
                name.to_path_buf()
            } else {
                path.parent()?.join(name)
            };
            [Some(by_name), build_id_path(id)]
                .into_iter()
                .flatten()
                .find(|p| p.is_file())
        });
    Some(FileInfo {
        has_dwarf,
        symbol_bytes,
        build_id,
        debuglink,
        altlink,
    })
}

/// `/usr/lib/debug/.build-id/ab/cdef....debug` for a build id.
fn build_id_path(id: &[u8]) -> Option<PathBuf> {
    let (first, rest) = id.split_first()?;
    let rest: String = rest.iter().map(|b| format!("{b:02x}")).collect();
    Some(Path::new(DEBUG_ROOT).join(format!(".build-id/{first:02x}/{rest}.debug")))
}

/// Finds a separate debug file with DWARF for the module at `path`, via build-id
/// or `.gnu_debuglink` (the CRC is not checked, but a differing build-id rejects
/// a candidate).
fn find_debug_file(path: &Path, info: &FileInfo) -> Option<PathBuf> {
    let mut candidates = Vec::new();
    candidates.extend(info.build_id.as_deref().and_then(build_id_path));
    if let Some(link) = &info.debuglink {
        let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        if let Some(dir) = real.parent() {
            candidates.push(dir.join(link));
            candidates.push(dir.join(".debug").join(link));
            let rel = dir.strip_prefix("/").unwrap_or(dir);
            candidates.push(Path::new(DEBUG_ROOT).join(rel).join(link));
        }
    }
    candidates.into_iter().find(|c| {
        if !c.is_file() || c.as_path() == path {
            return false;
        }
        inspect(c).is_some_and(|ci| {
            ci.has_dwarf
                && match (&info.build_id, &ci.build_id) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                }
        })
    })
}

/// Demangles a Rust (legacy or v0, hash suffix dropped) or Itanium C++ symbol;
/// anything else is returned unchanged.
fn demangle(raw: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(raw) {
        return format!("{d:#}");
    }
    if raw.starts_with("_Z") {
        if let Some(s) = cpp_demangle::Symbol::new(raw.as_bytes())
            .ok()
            .and_then(|sym| sym.demangle().ok())
        {
            return s;
        }
    }
    raw.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_rust_and_cpp() {
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangle("_ZN3foo3barEi"), "foo::bar(int)");
        assert_eq!(demangle("plain_c"), "plain_c");
        assert_eq!(demangle("_Zgarbage"), "_Zgarbage");
    }

    #[test]
    fn symbolizer_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Symbolizer>();
    }

    #[test]
    fn build_id_path_layout() {
        let p = build_id_path(&[0xab, 0xcd, 0x01]);
        assert_eq!(
            p,
            Some(PathBuf::from("/usr/lib/debug/.build-id/ab/cd01.debug"))
        );
        assert_eq!(build_id_path(&[]), None);
    }
}
