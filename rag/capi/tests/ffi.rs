//! The C entry points called from Rust: bad arguments are errors, never crashes.

use rag_capi::*;
use std::ffi::{c_char, CStr, CString};
use std::ptr::{null, null_mut};

/// Takes the message out of an error slot.
fn message(error: *mut c_char) -> String {
    assert!(!error.is_null(), "no error message");
    // SAFETY: a string from the library, freed right after.
    let s = unsafe { CStr::from_ptr(error) }
        .to_string_lossy()
        .into_owned();
    unsafe { rag_string_free(error) };
    s
}

#[test]
fn null_arguments_are_reported_as_errors() {
    let mut error = null_mut();
    let a = unsafe { rag_open(null(), null(), false, 0, &mut error) };
    assert!(a.is_null());
    assert!(message(error).contains("index_dir is NULL"));

    let q = CString::new("warranty").unwrap();
    let mut error = null_mut();
    let hits = unsafe { rag_search(null(), q.as_ptr(), 3, null(), &mut error) };
    assert!(hits.is_null());
    assert!(message(error).contains("handle is NULL"));

    let mut error = null_mut();
    let answer = unsafe {
        rag_ask(
            null(),
            q.as_ptr(),
            null(),
            None,
            null_mut(),
            null(),
            &mut error,
        )
    };
    assert!(answer.is_null());
    assert!(message(error).contains("handle is NULL"));

    // A NULL error slot is allowed: the failure is still reported by the return value.
    assert_eq!(
        unsafe { rag_add_paths(null(), null(), 0, null_mut(), null_mut()) },
        RAG_ERROR
    );
    // Freeing NULL is a no-op.
    unsafe {
        rag_close(null_mut());
        rag_hits_free(null_mut());
        rag_answer_free(null_mut());
        rag_string_free(null_mut());
    }
}

#[test]
fn indexing_searching_and_removing_through_the_abi() {
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("docs");
    std::fs::create_dir(&docs).unwrap();
    std::fs::write(docs.join("a.txt"), "The heron nests by the river.\n").unwrap();
    std::fs::write(docs.join("b.txt"), "Invoices are due in thirty days.\n").unwrap();
    let index = CString::new(dir.path().join("idx").to_str().unwrap()).unwrap();
    let mut error = null_mut();
    let a = unsafe { rag_open(index.as_ptr(), null(), false, 1, &mut error) };
    assert!(!a.is_null(), "{}", message(error));

    let path = CString::new(docs.to_str().unwrap()).unwrap();
    let paths = [path.as_ptr()];
    let mut chunks = 0u64;
    let rc = unsafe { rag_add_paths(a, paths.as_ptr(), 1, &mut chunks, &mut error) };
    assert_eq!(rc, RAG_OK);
    assert_eq!(chunks, 2);

    let q = CString::new("heron river").unwrap();
    let bm25 = CString::new("bm25").unwrap();
    let hits = unsafe { rag_search(a, q.as_ptr(), 5, bm25.as_ptr(), &mut error) };
    assert!(!hits.is_null());
    let list = unsafe { &*hits };
    assert_eq!(list.len, 1);
    let hit = unsafe { &*list.hits };
    let hit_path = unsafe { CStr::from_ptr(hit.path) }.to_str().unwrap();
    assert!(hit_path.ends_with("a.txt"));
    assert_eq!((hit.line_first, hit.line_last, hit.page), (1, 1, 0));
    assert!(unsafe { CStr::from_ptr(hit.text) }
        .to_str()
        .unwrap()
        .contains("heron"));
    unsafe { rag_hits_free(hits) };

    let bad_mode = CString::new("psychic").unwrap();
    let hits = unsafe { rag_search(a, q.as_ptr(), 5, bad_mode.as_ptr(), &mut error) };
    assert!(hits.is_null());
    assert!(message(error).contains("unknown search mode"));

    let file = CString::new(docs.join("a.txt").to_str().unwrap()).unwrap();
    let mut removed = 0usize;
    let rc = unsafe { rag_remove_path(a, file.as_ptr(), &mut removed, &mut error) };
    assert_eq!((rc, removed), (RAG_OK, 1));
    let hits = unsafe { rag_search(a, q.as_ptr(), 5, bm25.as_ptr(), &mut error) };
    assert_eq!(unsafe { (*hits).len }, 0);
    unsafe { rag_hits_free(hits) };

    let missing = CString::new(dir.path().join("missing").to_str().unwrap()).unwrap();
    let paths = [missing.as_ptr()];
    let rc = unsafe { rag_add_paths(a, paths.as_ptr(), 1, null_mut(), &mut error) };
    assert_eq!(rc, RAG_ERROR);
    assert!(message(error).contains("missing"));
    unsafe { rag_close(a) };
}

#[test]
fn invalid_utf8_is_an_error() {
    let bad = [0xffu8 as c_char, 0];
    let mut error = null_mut();
    let a = unsafe { rag_open(bad.as_ptr(), null(), false, 0, &mut error) };
    assert!(a.is_null());
    assert!(message(error).contains("not UTF-8"));
}

#[test]
fn version_is_the_crate_version() {
    let v = unsafe { CStr::from_ptr(rag_version()) };
    assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}
