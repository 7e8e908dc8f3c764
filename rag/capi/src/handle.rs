//! Opening, closing and indexing.

use crate::guard::{arg, contain, RAG_ERROR, RAG_OK};
use rag::assistant::{Assistant, AssistantOptions};
use rag::IndexOptions;
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

/// An open index plus a local LLM (opaque). Thread-safe: any function may be called on
/// one handle from several threads at once, except `rag_close`.
pub struct RagAssistant {
    pub(crate) inner: Assistant,
}

/// The handle behind `ptr`, or an error for NULL.
pub(crate) fn handle<'a>(ptr: *const RagAssistant) -> anyhow::Result<&'a Assistant> {
    anyhow::ensure!(!ptr.is_null(), "the assistant handle is NULL");
    // SAFETY: not NULL; the caller passes a handle from `rag_open` not yet closed.
    Ok(unsafe { &(*ptr).inner })
}

/// Opens (or creates) the index in `index_dir`. `model` is a model name (fetched on first
/// use) or a GGUF path, NULL for the default model; it is loaded on the first question.
/// `dense`: hybrid retrieval with the MiniLM embedder (loaded now), else BM25 only.
/// `threads`: compute threads, 0 for all cores.
///
/// Returns a handle to free with `rag_close`, or NULL with `*error` set.
///
/// # Safety
/// `index_dir` and `model` (if not NULL) are NUL-terminated strings; `error` is NULL or
/// points to storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn rag_open(
    index_dir: *const c_char,
    model: *const c_char,
    dense: bool,
    threads: u32,
    error: *mut *mut c_char,
) -> *mut RagAssistant {
    contain(error, std::ptr::null_mut(), || {
        let mut opts = AssistantOptions::new(arg(index_dir, "index_dir")?);
        if !model.is_null() {
            opts.model = arg(model, "model")?.to_owned();
        }
        opts.dense = dense;
        opts.threads = threads as usize;
        let inner = Assistant::open(opts)?;
        Ok(Box::into_raw(Box::new(RagAssistant { inner })))
    })
}

/// Closes the handle (waiting for background work such as writing the weights cache).
/// NULL is ignored. No other call on this handle may run or follow.
///
/// # Safety
/// `assistant` is NULL or a handle from `rag_open` not yet closed.
#[no_mangle]
pub unsafe extern "C" fn rag_close(assistant: *mut RagAssistant) {
    if assistant.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: from `Box::into_raw` in `rag_open`, closed once (the caller's contract).
        let a = unsafe { Box::from_raw(assistant) };
        a.inner.finish_background_work(|_| {});
    }));
}

/// Adds or updates `n_paths` files or folders (incremental: unchanged files are not
/// re-read). On success stores the index's chunk count in `*chunks_total` (if not NULL).
///
/// Returns `RAG_OK`, or `RAG_ERROR` with `*error` set.
///
/// # Safety
/// `paths` points to `n_paths` NUL-terminated strings; `chunks_total` is NULL or writable;
/// `error` as in `rag_open`.
#[no_mangle]
pub unsafe extern "C" fn rag_add_paths(
    assistant: *const RagAssistant,
    paths: *const *const c_char,
    n_paths: usize,
    chunks_total: *mut u64,
    error: *mut *mut c_char,
) -> i32 {
    contain(error, RAG_ERROR, || {
        let a = handle(assistant)?;
        anyhow::ensure!(!paths.is_null() || n_paths == 0, "paths is NULL");
        let list: Vec<PathBuf> = (0..n_paths)
            // SAFETY: `paths` holds `n_paths` pointers (the caller's contract).
            .map(|i| arg(unsafe { *paths.add(i) }, "a path").map(PathBuf::from))
            .collect::<anyhow::Result<_>>()?;
        let summary = a.add_paths(&list, &IndexOptions::default(), &|_| {})?;
        if !chunks_total.is_null() {
            // SAFETY: not NULL and writable (the caller's contract).
            unsafe { *chunks_total = summary.chunks_total };
        }
        Ok(RAG_OK)
    })
}

/// Removes a file, or every file under a folder, from the index; stores how many files
/// were removed in `*removed` (if not NULL).
///
/// Returns `RAG_OK`, or `RAG_ERROR` with `*error` set.
///
/// # Safety
/// `path` is a NUL-terminated string; `removed` is NULL or writable; `error` as in
/// `rag_open`.
#[no_mangle]
pub unsafe extern "C" fn rag_remove_path(
    assistant: *const RagAssistant,
    path: *const c_char,
    removed: *mut usize,
    error: *mut *mut c_char,
) -> i32 {
    contain(error, RAG_ERROR, || {
        let a = handle(assistant)?;
        let n = a.remove_path(arg(path, "path")?.as_ref())?;
        if !removed.is_null() {
            // SAFETY: not NULL and writable (the caller's contract).
            unsafe { *removed = n };
        }
        Ok(RAG_OK)
    })
}
