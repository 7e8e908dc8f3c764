//! Loading the HTP backend library at run time and creating the process-wide backend and
//! device handles. Nothing is linked at build time: without the libraries every QNN entry
//! point returns [`QnnError::LibsMissing`] with the command that installs them.

use crate::error::{QnnError, QnnResult};
use crate::ffi::{self, ApiVersion, FunctionTable, Handle};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Core API major.minor these bindings were written against (the wheel's HTP build reports
/// 2.40). A different minor within major 2 may still append slots, but struct changes
/// have happened between minors (see docs/qnn.md), so we refuse instead of guessing.
pub const EXPECTED_CORE_API: (u32, u32) = (2, 40);

/// SoC model passed to the HTP device (57 = SM8650): the emulator then runs as a recent
/// HTP (v75) with native fp16; without it it defaults to v68.
pub const DEFAULT_SOC_MODEL: u32 = 57;

/// Where the libraries live: `$RAG_QNN_LIB_DIR`, else `qnn-htp/` in the model cache
/// (`$RAG_MODEL_DIR`, else `~/.cache/rag/models`, as `rag::models::cache_dir`; the model
/// fetch puts the libraries there).
pub fn lib_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RAG_QNN_LIB_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let models = match std::env::var_os("RAG_MODEL_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/rag/models")
        }
    };
    models.join("qnn-htp")
}

/// Path of the HTP backend library inside [`lib_dir`] (the wheel's layout, which its RPATH
/// needs to find the bundled libc++).
pub fn htp_library_path(dir: &Path) -> PathBuf {
    dir.join("onnxruntime_qnn").join("libQnnHtp.so")
}

/// True when the HTP library file is present (no loading).
pub fn libs_present() -> bool {
    htp_library_path(&lib_dir()).is_file()
}

/// The loaded HTP library with one backend and one device handle for the whole process
/// (the backend allows one backend handle per library). Never unloaded.
pub struct QnnRuntime {
    _lib: libloading::Library,
    table: *const FunctionTable,
    api: ApiVersion,
    build_id: String,
    backend: Handle,
    device: Handle,
    /// Exclusive: graph construction, finalize, serialization, anything that silences
    /// stdout. Shared: loading a context binary, retrieving its graph, executing, freeing
    /// (each on its own context; `&mut` access keeps one context to one thread).
    lock: RwLock<()>,
    /// Makes every call exclusive (every QNN call serialized, as before the shared lock): `RAG_QNN_SERIAL_CALLS=1` or
    /// [`QnnRuntime::set_serial_calls`].
    serial: AtomicBool,
    /// Calls holding the lock now, and the most seen at once since the last
    /// [`QnnRuntime::take_max_concurrent_calls`].
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

enum Held<'a> {
    Shared(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

/// A held QNN call lock, shared or exclusive; counts the calls in flight.
pub(crate) struct CallGuard<'a> {
    rt: &'a QnnRuntime,
    _held: Held<'a>,
}

impl<'a> CallGuard<'a> {
    fn new(rt: &'a QnnRuntime, held: Held<'a>) -> Self {
        let n = rt.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        rt.max_in_flight.fetch_max(n, Ordering::SeqCst);
        CallGuard { rt, _held: held }
    }
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.rt.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

// SAFETY: the handles are opaque tokens owned by the library. Every call that uses them
// holds `QnnRuntime::lock`: exclusively for everything but load/retrieve/execute/free,
// which run concurrently only on distinct contexts (tests/qnn_concurrency.rs checks this
// on the library: results unchanged, no errors).
unsafe impl Send for QnnRuntime {}
// SAFETY: as above; shared access only reads the immutable table pointer and versions.
unsafe impl Sync for QnnRuntime {}

static RUNTIME: OnceLock<Result<QnnRuntime, QnnError>> = OnceLock::new();

/// The process-wide runtime, loading the library on first use.
pub fn runtime() -> QnnResult<&'static QnnRuntime> {
    RUNTIME
        .get_or_init(|| QnnRuntime::load(&lib_dir()))
        .as_ref()
        .map_err(Clone::clone)
}

/// Turns a QNN return value into a result.
pub fn check(call: &'static str, code: ffi::ErrorHandle) -> QnnResult<()> {
    if code == ffi::SUCCESS {
        Ok(())
    } else {
        Err(QnnError::Call { call, code })
    }
}

extern "C" {
    fn dup(fd: c_int) -> c_int;
    fn dup2(old: c_int, new: c_int) -> c_int;
    fn close(fd: c_int) -> c_int;
    fn fflush(stream: *mut c_void) -> c_int;
}

/// Runs `f` with file descriptor 1 pointed at /dev/null: the HTP library prints to stdout
/// (C stdio, flushed here) while it initialises and on every graphCreate (`unexpected
/// GraphHtpSettings option 66`), which would corrupt our stdout (CLI output, JSON). stderr
/// is untouched. Process-wide: other threads' stdout writes in that window are lost too,
/// so only short library calls go through here.
pub(crate) fn with_stdout_silenced<T>(f: impl FnOnce() -> T) -> T {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else {
        return f();
    };
    // SAFETY: dup/dup2/close/fflush are called on valid descriptors (1 and the /dev/null
    // file we hold open); on any failure we fall back to running `f` unredirected.
    unsafe {
        let saved = dup(1);
        if saved < 0 {
            return f();
        }
        if dup2(null.as_raw_fd(), 1) < 0 {
            close(saved);
            return f();
        }
        let out = f();
        fflush(std::ptr::null_mut());
        dup2(saved, 1);
        close(saved);
        out
    }
}

impl QnnRuntime {
    fn load(dir: &Path) -> QnnResult<QnnRuntime> {
        let path = htp_library_path(dir);
        if !path.is_file() {
            return Err(QnnError::LibsMissing(path));
        }
        let load_err = |msg: String| QnnError::Load {
            path: path.clone(),
            msg,
        };
        with_stdout_silenced(|| {
            // SAFETY: loading a shared library runs its initialisers; this is the library
            // the fetch script installed and verified by sha256.
            let lib =
                unsafe { libloading::Library::new(&path) }.map_err(|e| load_err(e.to_string()))?;
            // SAFETY: the symbol has the documented `QnnInterface_getProviders` signature.
            let get: libloading::Symbol<ffi::GetProvidersFn> =
                unsafe { lib.get(b"QnnInterface_getProviders\0") }
                    .map_err(|e| load_err(e.to_string()))?;
            let mut list: *const *const ffi::InterfaceProvider = std::ptr::null();
            let mut n = 0u32;
            // SAFETY: both out-pointers are valid for writes.
            check("getProviders", unsafe { get(&mut list, &mut n) })?;
            if list.is_null() || n == 0 {
                return Err(load_err("no interface providers".into()));
            }
            // SAFETY: the library returned `n` valid provider pointers that live as long
            // as the library (which we keep loaded forever).
            let providers: Vec<&ffi::InterfaceProvider> =
                unsafe { std::slice::from_raw_parts(list, n as usize) }
                    .iter()
                    .filter_map(|p| {
                        // SAFETY: each entry is null or a provider in the library's data.
                        unsafe { p.as_ref() }
                    })
                    .collect();
            let p = providers
                .iter()
                .find(|p| p.backend_id == ffi::BACKEND_ID_HTP)
                .ok_or_else(|| {
                    load_err(format!(
                        "no HTP provider among (backend id, API) {:?}",
                        providers
                            .iter()
                            .map(|p| (p.backend_id, p.api_version))
                            .collect::<Vec<_>>()
                    ))
                })?;
            // SAFETY: provider names are NUL-terminated static strings.
            let name = unsafe { cstr(p.provider_name) };
            let core = p.api_version.core;
            if (core.major, core.minor) != EXPECTED_CORE_API {
                return Err(QnnError::Version {
                    provider: name,
                    found: format!("{}.{}.{}", core.major, core.minor, core.patch),
                    expected: format!("{}.{}", EXPECTED_CORE_API.0, EXPECTED_CORE_API.1),
                });
            }
            let table: *const FunctionTable = &p.table;
            // SAFETY: the table lives in the library's static data.
            let t = unsafe { &*table };
            // Cross-check the table layout: the version reported through slot 3 must equal
            // the provider's, and slot 4 must give a build id string.
            let mut api = ApiVersion::default();
            let f = t
                .backend_get_api_version
                .ok_or_else(|| load_err("no getApiVersion".into()))?;
            // SAFETY: `api` is a valid out-pointer of the declared type.
            check("backendGetApiVersion", unsafe { f(&mut api) })?;
            if api != p.api_version {
                return Err(load_err(format!(
                    "function table mismatch: provider says {:?}, getApiVersion says {api:?}",
                    p.api_version
                )));
            }
            let mut id: *const c_char = std::ptr::null();
            let f = t
                .backend_get_build_id
                .ok_or_else(|| load_err("no getBuildId".into()))?;
            // SAFETY: `id` is a valid out-pointer; the string is owned by the library.
            check("backendGetBuildId", unsafe { f(&mut id) })?;
            // SAFETY: the library returned a NUL-terminated string (or null).
            let build_id = unsafe { cstr(id) };
            let mut backend: Handle = std::ptr::null_mut();
            let f = t
                .backend_create
                .ok_or_else(|| load_err("no backendCreate".into()))?;
            // SAFETY: null logger and config are allowed; `backend` is an out-pointer.
            check("backendCreate", unsafe {
                f(std::ptr::null_mut(), std::ptr::null(), &mut backend)
            })?;
            let device = create_device(t, DEFAULT_SOC_MODEL)?;
            Ok(QnnRuntime {
                _lib: lib,
                table,
                api,
                build_id,
                backend,
                device,
                lock: RwLock::new(()),
                serial: AtomicBool::new(
                    std::env::var("RAG_QNN_SERIAL_CALLS").as_deref() == Ok("1"),
                ),
                in_flight: AtomicUsize::new(0),
                max_in_flight: AtomicUsize::new(0),
            })
        })
    }

    pub fn api_version(&self) -> ApiVersion {
        self.api
    }

    /// e.g. "v2.51.0..." — part of the context-binary cache key.
    pub fn build_id(&self) -> &str {
        &self.build_id
    }

    pub(crate) fn table(&self) -> &FunctionTable {
        // SAFETY: points into the library's static data; the library is never unloaded.
        unsafe { &*self.table }
    }

    pub(crate) fn backend(&self) -> Handle {
        self.backend
    }

    pub(crate) fn device(&self) -> Handle {
        self.device
    }

    /// Excludes every other QNN call.
    pub(crate) fn lock(&self) -> CallGuard<'_> {
        let held = Held::Exclusive(self.lock.write().unwrap_or_else(|e| e.into_inner()));
        CallGuard::new(self, held)
    }

    /// For calls on one context that may overlap calls on other contexts (load, retrieve,
    /// execute, free); exclusive when serial calls are asked for.
    pub(crate) fn shared(&self) -> CallGuard<'_> {
        if self.serial.load(Ordering::Relaxed) {
            return self.lock();
        }
        let held = Held::Shared(self.lock.read().unwrap_or_else(|e| e.into_inner()));
        CallGuard::new(self, held)
    }

    /// Serialises every QNN call (true) or lets loads, frees and executions of different
    /// contexts overlap (false, the default).
    pub fn set_serial_calls(&self, serial: bool) {
        self.serial.store(serial, Ordering::Relaxed);
    }

    /// The most QNN calls that ran at the same time since the last call of this (resets).
    pub fn take_max_concurrent_calls(&self) -> usize {
        self.max_in_flight
            .swap(self.in_flight.load(Ordering::SeqCst), Ordering::SeqCst)
    }

    pub fn serial_calls(&self) -> bool {
        self.serial.load(Ordering::Relaxed)
    }
}

fn create_device(t: &FunctionTable, soc_model: u32) -> QnnResult<Handle> {
    let f = t
        .device_create
        .ok_or_else(|| QnnError::Invalid("no deviceCreate".into()))?;
    let custom = ffi::HtpDeviceCustomConfig {
        option: ffi::HTP_DEVICE_CONFIG_OPTION_SOC,
        payload: ffi::HtpDevicePayload { _reserve: [0; 3] },
    };
    let mut custom = custom;
    custom.payload.soc_model = soc_model;
    let cfg = ffi::DeviceConfig {
        option: ffi::DEVICE_CONFIG_OPTION_CUSTOM,
        custom: &custom as *const _ as *const c_void,
    };
    let list: [*const ffi::DeviceConfig; 2] = [&cfg, std::ptr::null()];
    let mut device: Handle = std::ptr::null_mut();
    // SAFETY: a null-terminated config list of valid structs that outlive the call.
    check("deviceCreate", unsafe {
        f(std::ptr::null_mut(), list.as_ptr(), &mut device)
    })?;
    Ok(device)
}

/// Copies a C string owned by the library (empty if null).
///
/// # Safety
/// `p` must be null or point to a NUL-terminated string.
unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: guaranteed by the caller.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_libs_say_how_to_fetch_them() {
        let dir = std::env::temp_dir().join("rag-qnn-no-such-dir");
        let err = QnnRuntime::load(&dir).err().expect("must fail");
        let msg = err.to_string();
        assert!(matches!(err, QnnError::LibsMissing(_)));
        assert!(msg.contains("scripts/fetch-model.sh qnn-htp"), "{msg}");
    }

    #[test]
    fn silenced_stdout_is_restored() {
        let v = with_stdout_silenced(|| 7);
        assert_eq!(v, 7);
        // fd 1 still writable after restore.
        use std::io::Write;
        assert!(std::io::stdout().flush().is_ok());
    }
}
