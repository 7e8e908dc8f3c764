//! Files replaced whole: what the drafter keeps between processes (the verify-cost
//! curve, the learned state, the token database) is rewritten while other `rag`
//! processes may read it, and a kill may come at any moment.

use std::io::Write;
use std::path::Path;

/// `bytes` into `path` through a hidden temporary file of this process in the same
/// directory, synced, then renamed over `path`: a reader, or another process writing the
/// same file, sees the old file or the new one, never a part. Creates the directory; on
/// failure the temporary file is removed.
pub(crate) fn write_replacing(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"))?;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary_behind() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/dir/state.json");
        write_replacing(&p, b"first").unwrap();
        write_replacing(&p, b"second, longer").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second, longer");
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state.json"]);
    }

    #[test]
    fn a_failed_rename_keeps_the_old_state_and_cleans_up() {
        // The target is a non-empty directory: the rename fails.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("taken");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("inside"), b"x").unwrap();
        assert!(write_replacing(&p, b"new").is_err());
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["taken"]);
        assert!(
            write_replacing(Path::new("/"), b"x").is_err(),
            "no file name"
        );
    }
}
