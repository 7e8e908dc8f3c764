//! Retrieval: `rag_search` and its result list.

use crate::guard::{arg, contain, free_c_string, owned_c_string};
use crate::handle::{handle, RagAssistant};
use rag::SearchMode;
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// One retrieved passage. Its strings belong to the list: freed by `rag_hits_free`.
#[repr(C)]
pub struct RagHit {
    /// Stable id of the chunk in the index.
    pub chunk_id: i64,
    /// The indexed file (absolute path).
    pub path: *mut c_char,
    /// First and last line of the passage; both 0 for PDF pages and HTML.
    pub line_first: u32,
    pub line_last: u32,
    /// PDF page; 0 otherwise.
    pub page: u32,
    /// Markdown heading path, or NULL.
    pub heading: *mut c_char,
    pub text: *mut c_char,
    /// Fused score (hybrid) or the single method's score.
    pub score: f32,
}

/// Hits, best first.
#[repr(C)]
pub struct RagHits {
    pub hits: *mut RagHit,
    pub len: usize,
}

/// `hybrid` (BM25 and dense fused), `bm25` or `dense`; NULL: hybrid.
fn mode(s: *const c_char) -> anyhow::Result<SearchMode> {
    if s.is_null() {
        Ok(SearchMode::Hybrid)
    } else {
        arg(s, "mode")?.parse()
    }
}

/// The `k` best passages for `query`. `mode` is "hybrid", "bm25", "dense" or NULL (hybrid).
///
/// Returns a list to free with `rag_hits_free`, or NULL with `*error` set.
///
/// # Safety
/// `query` and `mode` (if not NULL) are NUL-terminated strings; `error` as in `rag_open`.
#[no_mangle]
pub unsafe extern "C" fn rag_search(
    assistant: *const RagAssistant,
    query: *const c_char,
    k: usize,
    mode: *const c_char,
    error: *mut *mut c_char,
) -> *mut RagHits {
    contain(error, std::ptr::null_mut(), || {
        let a = handle(assistant)?;
        let hits = a.retrieve(arg(query, "query")?, k, self::mode(mode)?)?;
        let hits: Box<[RagHit]> = hits
            .into_iter()
            .map(|h| RagHit {
                chunk_id: h.chunk_id,
                path: owned_c_string(&h.path),
                line_first: h.lines.map_or(0, |l| l.0),
                line_last: h.lines.map_or(0, |l| l.1),
                page: h.page.unwrap_or(0),
                heading: h
                    .heading
                    .as_deref()
                    .map_or(std::ptr::null_mut(), owned_c_string),
                text: owned_c_string(&h.text),
                score: h.score,
            })
            .collect();
        let len = hits.len();
        let hits = Box::into_raw(hits).cast::<RagHit>();
        Ok(Box::into_raw(Box::new(RagHits { hits, len })))
    })
}

/// Frees a list from `rag_search` and all its strings. NULL is ignored.
///
/// # Safety
/// `hits` is NULL or a list from `rag_search` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn rag_hits_free(hits: *mut RagHits) {
    if hits.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: from `Box::into_raw` in `rag_search`, freed once (the caller's contract);
        // the array was a boxed slice of exactly `len` hits.
        let list = unsafe { Box::from_raw(hits) };
        let all = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list.hits, list.len)) };
        for h in all.iter() {
            free_c_string(h.path);
            free_c_string(h.heading);
            free_c_string(h.text);
        }
    }));
}
