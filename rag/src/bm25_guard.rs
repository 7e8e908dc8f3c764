//! tantivy panics on some damaged index files (a slice past a file's end while opening a
//! segment) instead of returning an error. [`guarded`] turns such a panic into tantivy's
//! own corruption error, so a damaged text index is reported like any other damage
//! ([`crate::index_files::is_damaged`]) and its panic message is kept off stderr.

use std::cell::Cell;
use std::sync::Once;

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Wraps the process's panic hook once: panics inside [`guarded`] on this thread are not
/// printed (the error carries their message); every other panic is, as before.
fn install_quiet_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
}

/// Runs `f`; a panic in it becomes a `DataCorruption` error.
pub fn guarded<T>(what: &str, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    install_quiet_hook();
    let was = QUIET.with(|q| q.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    r.unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        let e = tantivy::error::DataCorruption::comment_only(format!("{what}: {msg}"));
        Err(tantivy::TantivyError::DataCorruption(e).into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_corruption_error() {
        let e = guarded("reading", || -> anyhow::Result<()> {
            panic!("slice past end")
        })
        .unwrap_err();
        assert!(crate::index_files::is_damaged(&e), "{e:#}");
        assert!(
            format!("{e:#}").contains("reading: slice past end"),
            "{e:#}"
        );
        assert_eq!(guarded("x", || Ok(3)).unwrap(), 3);
    }
}
