//! Reading a file under a size cap, before anything parses it.

use crate::detect::{Skip, SkipReason};
use std::io::Read;
use std::path::Path;

/// Read the whole file unless it exceeds `max_bytes` (checked before and while reading,
/// so a file growing underneath us cannot blow memory).
pub fn read_file(path: &Path, max_bytes: u64) -> Result<Vec<u8>, Skip> {
    let unreadable = |e: std::io::Error| Skip::new(SkipReason::Unreadable, e.to_string());
    let too_large = |n: u64| {
        Skip::new(
            SkipReason::TooLarge,
            format!("{n} bytes, over the {max_bytes} byte limit"),
        )
    };
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    if !meta.is_file() {
        return Err(Skip::new(SkipReason::Unreadable, "not a regular file"));
    }
    if meta.len() > max_bytes {
        return Err(too_large(meta.len()));
    }
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let mut buf = Vec::with_capacity(meta.len() as usize);
    file.take(max_bytes + 1)
        .read_to_end(&mut buf)
        .map_err(unreadable)?;
    if buf.len() as u64 > max_bytes {
        return Err(too_large(buf.len() as u64));
    }
    Ok(buf)
}
