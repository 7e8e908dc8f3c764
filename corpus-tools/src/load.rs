//! Reading a file under a size cap, before anything parses it.

use crate::detect::SkipReason;
use std::io::Read;
use std::path::Path;

/// Read the whole file unless it exceeds `max_bytes` (checked before and while reading,
/// so a file growing underneath us cannot blow memory).
pub fn read_file(path: &Path, max_bytes: u64) -> Result<Vec<u8>, SkipReason> {
    let meta = std::fs::metadata(path).map_err(|_| SkipReason::Unreadable)?;
    if !meta.is_file() {
        return Err(SkipReason::Unreadable);
    }
    if meta.len() > max_bytes {
        return Err(SkipReason::TooLarge);
    }
    let file = std::fs::File::open(path).map_err(|_| SkipReason::Unreadable)?;
    let mut buf = Vec::with_capacity(meta.len() as usize);
    file.take(max_bytes + 1)
        .read_to_end(&mut buf)
        .map_err(|_| SkipReason::Unreadable)?;
    if buf.len() as u64 > max_bytes {
        return Err(SkipReason::TooLarge);
    }
    Ok(buf)
}
