//! Panic and error containment at the boundary, and the strings that cross it.

use std::any::Any;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Return value of the functions that return a status: success.
pub const RAG_OK: i32 = 0;
/// Return value of the functions that return a status: failure (see `error`).
pub const RAG_ERROR: i32 = -1;

/// Runs `f`; on an error or a panic stores the message in `*error` (if `error` is not
/// NULL) and returns `failed`.
pub(crate) fn contain<T>(
    error: *mut *mut c_char,
    failed: T,
    f: impl FnOnce() -> anyhow::Result<T>,
) -> T {
    let message = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => return v,
        Ok(Err(e)) => format!("{e:#}"),
        Err(payload) => format!("internal error (a bug in rag): {}", panic_text(&*payload)),
    };
    if !error.is_null() {
        // SAFETY: the caller passes NULL or a pointer to writable storage for one pointer
        // (the header's contract for every `error` parameter).
        unsafe { *error = owned_c_string(&message) };
    }
    failed
}

fn panic_text(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "panic"
    }
}

/// A string the caller frees with `rag_string_free` (NUL bytes inside become U+FFFD).
pub(crate) fn owned_c_string(s: &str) -> *mut c_char {
    let s = if s.contains('\0') {
        s.replace('\0', "\u{fffd}")
    } else {
        s.to_owned()
    };
    CString::new(s).map_or(std::ptr::null_mut(), CString::into_raw)
}

/// Frees a string returned by this library (`NULL` is ignored).
pub(crate) fn free_c_string(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: `s` came from `owned_c_string` (CString::into_raw) and is freed once.
        drop(unsafe { CString::from_raw(s) });
    }
}

/// The UTF-8 text of a caller's NUL-terminated string argument.
pub(crate) fn arg<'a>(s: *const c_char, what: &str) -> anyhow::Result<&'a str> {
    anyhow::ensure!(!s.is_null(), "{what} is NULL");
    // SAFETY: not NULL, and the caller passes a NUL-terminated string that lives for the call.
    let s = unsafe { CStr::from_ptr(s) };
    s.to_str()
        .map_err(|e| anyhow::anyhow!("{what} is not UTF-8: {e}"))
}

/// Frees an error message set by this library. NULL is ignored. (The strings inside results
/// are freed with their result, never with this.)
///
/// # Safety
/// `s` is NULL or an error message this library set and that was not freed yet.
#[no_mangle]
pub unsafe extern "C" fn rag_string_free(s: *mut c_char) {
    let _ = catch_unwind(|| free_c_string(s));
}

/// The library's version (a static string: do not free).
#[no_mangle]
pub extern "C" fn rag_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
