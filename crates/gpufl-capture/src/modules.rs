//! Module loads: each module's cubin gives its functions' stack sizes, written as `function`
//! records (see [`crate::cubin`] and docs/trace-format.md).
//!
//! CUPTI calls [`on_module_loaded`] on the loading thread (`CUPTI_CBID_RESOURCE_MODULE_LOADED`),
//! with the image valid only during the call. Module loads are rare, so the image is parsed there
//! (bounded: images over [`cubin::MAX_CUBIN_BYTES`] are skipped) and only names and sizes are
//! kept; the writer thread drains them ([`drain_into`]), demangling and interning the names as
//! kernel names are. Images that cannot be read are counted per reason and reported in one
//! `info` notice at the end.

use crate::cubin::{self, CubinError, FunctionStack};
use crate::cupti::{cb_field, sys};
use crate::sink::Sink;
use crossbeam_queue::SegQueue;
use gpufl_trace::{Function, Notice, Record, TraceError};
use std::collections::BTreeMap;
use std::ffi::{c_char, c_void};
use std::mem::offset_of;
use std::sync::Mutex;

struct Loaded {
    module: u32,
    functions: Vec<FunctionStack>,
}

/// What the module-loaded callback hands the writer (the module's one static).
struct Modules {
    /// Modules read, for the writer.
    loaded: SegQueue<Loaded>,
    /// Modules not read, per reason.
    skipped: Mutex<BTreeMap<String, u64>>,
}

static MODULES: Modules = Modules {
    loaded: SegQueue::new(),
    skipped: Mutex::new(BTreeMap::new()),
};

fn skip(reason: &str) {
    let mut s = MODULES.skipped.lock().unwrap_or_else(|e| e.into_inner());
    *s.entry(reason.to_string()).or_insert(0) += 1;
}

/// What a module image gives: its functions, or why not.
pub fn read_image(image: &[u8]) -> Result<Vec<FunctionStack>, CubinError> {
    cubin::stack_sizes(image)
}

/// `CUPTI_CBID_RESOURCE_MODULE_LOADED`: read the module's cubin.
///
/// # Safety
/// `data` must be the `CUpti_ResourceData` CUPTI passed with that callback id.
pub unsafe fn on_module_loaded(data: *const c_void) {
    type R = sys::CUpti_ResourceData;
    type M = sys::CUpti_ModuleResourceData;
    // SAFETY: field offsets of CUpti_ResourceData (cudarc's bindings of cupti_callbacks.h).
    let desc: *const c_void = unsafe { cb_field(data, offset_of!(R, resourceDescriptor)) };
    if desc.is_null() {
        skip("no module data");
        return;
    }
    // SAFETY: for module callbacks the descriptor is a CUpti_ModuleResourceData.
    let (module, size, image): (u32, usize, *const c_char) = unsafe {
        (
            cb_field(desc, offset_of!(M, moduleId)),
            cb_field(desc, offset_of!(M, cubinSize)),
            cb_field(desc, offset_of!(M, pCubin)),
        )
    };
    if image.is_null() || size == 0 {
        skip("no image");
        return;
    }
    if size > cubin::MAX_CUBIN_BYTES {
        skip(&CubinError::TooLarge.to_string());
        return;
    }
    // SAFETY: CUPTI's image of `size` bytes, valid for the duration of the callback.
    let bytes = unsafe { std::slice::from_raw_parts(image.cast::<u8>(), size) };
    crate::kernel_detail::on_module_image(bytes);
    match read_image(bytes) {
        Ok(functions) => MODULES.loaded.push(Loaded { module, functions }),
        Err(e) => skip(&e.to_string()),
    }
}

/// Write the `function` records of the modules loaded since the last call.
pub fn drain_into(s: &mut Sink) -> Result<(), TraceError> {
    while let Some(m) = MODULES.loaded.pop() {
        for f in m.functions {
            let name = s.kernel_name(&f.name)?;
            s.write(&Record::Function(Function {
                name,
                module: m.module,
                frame: f.frame,
                stack: f.stack,
                source: None,
            }))?;
        }
    }
    Ok(())
}

/// At stop: the last records, and one notice for the modules not read.
pub fn finish_into(s: &mut Sink) -> Result<(), TraceError> {
    drain_into(s)?;
    let skipped = std::mem::take(&mut *MODULES.skipped.lock().unwrap_or_else(|e| e.into_inner()));
    if let Some(message) = skipped_message(&skipped) {
        s.write(&Record::Notice(Notice {
            level: "info".into(),
            message,
        }))?;
    }
    Ok(())
}

fn skipped_message(skipped: &BTreeMap<String, u64>) -> Option<String> {
    let total: u64 = skipped.values().sum();
    (total > 0).then(|| {
        let why: Vec<String> = skipped.iter().map(|(r, n)| format!("{r}: {n}")).collect();
        format!(
            "cubins: {total} module(s) not parsed, their functions' stack frames are unknown ({})",
            why.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_modules_are_summed_per_reason() {
        let mut m = BTreeMap::new();
        assert_eq!(skipped_message(&m), None);
        m.insert(CubinError::NotElf.to_string(), 2);
        m.insert("no image".to_string(), 1);
        assert_eq!(
            skipped_message(&m).unwrap(),
            "cubins: 3 module(s) not parsed, their functions' stack frames are unknown \
             (no image: 1, not an ELF image (PTX, or a fat binary): 2)"
        );
    }

    /// The callback reads CUPTI's structs through cudarc's layout; a fake CUpti_ResourceData
    /// pointing at a PTX image is counted as skipped, and a null descriptor too.
    #[test]
    fn the_callback_reads_the_module_descriptor() {
        let ptx = b".version 8.5\n.target sm_90\n";
        let module = sys::CUpti_ModuleResourceData {
            moduleId: 7,
            cubinSize: ptx.len(),
            pCubin: ptx.as_ptr().cast(),
        };
        // SAFETY: an all-zero CUpti_ResourceData is valid (null pointers, zero union).
        let mut res: sys::CUpti_ResourceData = unsafe { std::mem::zeroed() };
        res.resourceDescriptor = (&module as *const sys::CUpti_ModuleResourceData)
            .cast_mut()
            .cast();
        let before = MODULES
            .skipped
            .lock()
            .unwrap()
            .get(&CubinError::NotElf.to_string())
            .copied()
            .unwrap_or(0);
        // SAFETY: a CUpti_ResourceData whose descriptor is a module's.
        unsafe { on_module_loaded((&res as *const sys::CUpti_ResourceData).cast()) };
        let after = MODULES.skipped.lock().unwrap()[&CubinError::NotElf.to_string()];
        assert_eq!(after, before + 1);
        res.resourceDescriptor = std::ptr::null_mut();
        // SAFETY: as above.
        unsafe { on_module_loaded((&res as *const sys::CUpti_ResourceData).cast()) };
        assert!(MODULES.skipped.lock().unwrap()["no module data"] >= 1);
    }

    /// A loaded cubin becomes `function` records named as the kernel records of the same
    /// function are (demangled, one string id).
    #[test]
    fn a_loaded_cubin_becomes_function_records_named_like_kernels() {
        use gpufl_trace::{Header, Kernel, TraceWriter};
        let image = crate::cubin::tests::two_kernels();
        let module = sys::CUpti_ModuleResourceData {
            moduleId: 42,
            cubinSize: image.len(),
            pCubin: image.as_ptr().cast(),
        };
        // SAFETY: an all-zero CUpti_ResourceData is valid (null pointers, zero union).
        let mut res: sys::CUpti_ResourceData = unsafe { std::mem::zeroed() };
        res.resourceDescriptor = (&module as *const sys::CUpti_ModuleResourceData)
            .cast_mut()
            .cast();
        // SAFETY: a CUpti_ResourceData whose descriptor is a module's.
        unsafe { on_module_loaded((&res as *const sys::CUpti_ResourceData).cast()) };

        let path = std::env::temp_dir().join(format!("gpufl-modules-{}.zst", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        let w = TraceWriter::new(std::io::BufWriter::new(file), &Header::default()).unwrap();
        let mut sink = Sink::new(w, None);
        drain_into(&mut sink).unwrap();
        let kname = b"_Z6spillsPfi\0";
        sink.take_decoded(crate::activity::Decoded::Kernel {
            name: kname.as_ptr().cast(),
            kernel: Kernel {
                start: 1,
                end: 2,
                ..Kernel::default()
            },
        })
        .unwrap();
        sink.finish("test").unwrap();
        let mut strings = std::collections::HashMap::new();
        let mut functions = Vec::new();
        let mut kernel_name = None;
        for rec in gpufl_trace::TraceReader::open(&path).unwrap() {
            match rec {
                Record::Str(s) => {
                    strings.insert(s.id, s.s);
                }
                Record::Function(f) => {
                    functions.push((strings[&f.name].clone(), f.module, f.frame, f.stack))
                }
                Record::Kernel(k) => kernel_name = Some(k.name),
                _ => {}
            }
        }
        std::fs::remove_file(&path).ok();
        let ours: Vec<_> = functions.iter().filter(|f| f.1 == 42).cloned().collect();
        assert_eq!(
            ours,
            vec![
                ("clean(float*)".to_string(), 42, Some(0), Some(0)),
                ("helper()".to_string(), 42, Some(40), Some(0)),
                ("spills(float*, int)".to_string(), 42, Some(568), Some(568)),
            ]
        );
        assert_eq!(strings[&kernel_name.unwrap()], "spills(float*, int)");
    }
}
