//! One verified file from the Hub into the cache: streamed to `<file>.partial` with a
//! progress bar, resumed with an HTTP range after an interruption, checked against its
//! sha256 and only then renamed into place. A lock file (`<file>.lock`) lets one process at
//! a time download it; the others wait and then find it verified.

use super::hub::Hub;
use super::verify::{file_matches, record_verified, sha256_file, with_suffix};
use anyhow::{bail, Context, Result};
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::Path;

/// Interrupted transfers resumed before giving up (the partial file stays for next time).
const ATTEMPTS: usize = 3;

/// What to fetch: `path` of `repo_id`, with the sha256 it must have.
pub struct Wanted<'a> {
    pub repo_id: &'a str,
    pub path: &'a str,
    pub sha256: &'a str,
    /// Expected size, for the progress bar and to discard an oversized partial file.
    pub size: Option<u64>,
}

/// Makes `dest` a verified copy of `want` (nothing to do when it already is).
pub fn fetch(hub: &Hub, want: &Wanted, dest: &Path, log: &mut dyn FnMut(&str)) -> Result<()> {
    if file_matches(dest, want.sha256)? {
        return Ok(());
    }
    let dir = dest
        .parent()
        .context("a download needs a parent directory")?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let lock_path = with_suffix(dest, ".lock");
    let lock = File::create(&lock_path)
        .with_context(|| format!("creating the lock file {}", lock_path.display()))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            log(&format!(
                "{}: another process is downloading it; waiting",
                dest.display()
            ));
            lock.lock()
                .with_context(|| format!("locking {}", lock_path.display()))?;
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", lock_path.display()))
        }
    }
    // The process that held the lock may have finished it.
    if file_matches(dest, want.sha256)? {
        return Ok(());
    }
    let partial = with_suffix(dest, ".partial");
    let mut last_err = None;
    for _ in 0..ATTEMPTS {
        match transfer(hub, want, &partial, log) {
            Ok(()) => {
                last_err = None;
                break;
            }
            Err(Failure::Fatal(e)) => return Err(e),
            Err(Failure::Interrupted(e)) => {
                log(&format!("{}: {e:#}; resuming", want.path));
                last_err = Some(e);
            }
        }
    }
    if let Some(e) = last_err {
        return Err(e.context(format!(
            "downloading {} was interrupted {ATTEMPTS} times; run the same command again to resume from {}",
            want.path,
            partial.display()
        )));
    }
    let got = sha256_file(&partial)?;
    if !got.eq_ignore_ascii_case(want.sha256) {
        let _ = fs::remove_file(&partial);
        bail!(
            "{}: sha256 mismatch (got {got}, expected {}); the download was removed (run the command again to fetch it afresh)",
            want.path,
            want.sha256
        );
    }
    fs::rename(&partial, dest)
        .with_context(|| format!("moving the model into {}", dest.display()))?;
    record_verified(dest, want.sha256);
    Ok(())
}

enum Failure {
    /// The transfer stopped part way: resume it.
    Interrupted(anyhow::Error),
    /// The server refused or sent something unusable.
    Fatal(anyhow::Error),
}

/// One request: appends to `partial` from its current length.
fn transfer(
    hub: &Hub,
    want: &Wanted,
    partial: &Path,
    log: &mut dyn FnMut(&str),
) -> Result<(), Failure> {
    let fatal = |e: anyhow::Error| Failure::Fatal(e);
    let mut have = fs::metadata(partial).map_or(0, |m| m.len());
    if want.size.is_some_and(|s| have > s) {
        have = 0;
    }
    let mut resp = hub
        .download(want.repo_id, want.path, Some(have))
        .map_err(fatal)?;
    let mut out = match resp.status {
        206 if resp.range_start == Some(have) => OpenOptions::new()
            .append(true)
            .open(partial)
            .with_context(|| format!("opening {}", partial.display()))
            .map_err(fatal)?,
        // The whole file (a server that ignores ranges, or a fresh start).
        200 | 206 => {
            have = 0;
            File::create(partial)
                .with_context(|| format!("creating {}", partial.display()))
                .map_err(fatal)?
        }
        // The range starts at the end: the partial file is complete or stale; hash decides.
        416 if have > 0 && want.size == Some(have) => return Ok(()),
        416 => {
            let _ = fs::remove_file(partial);
            return Err(Failure::Interrupted(anyhow::anyhow!(
                "the server refused to resume at byte {have}; starting over"
            )));
        }
        404 => {
            return Err(fatal(anyhow::anyhow!(
                "hf.co/{}/{} was not found on {} (HTTP 404)",
                want.repo_id,
                want.path,
                hub.endpoint()
            )))
        }
        s => {
            return Err(fatal(anyhow::anyhow!(
                "downloading hf.co/{}/{} from {}: HTTP {s}",
                want.repo_id,
                want.path,
                hub.endpoint()
            )))
        }
    };
    let total = want.size.or(resp.length.map(|l| l + have));
    if have > 0 {
        log(&format!("{}: resuming at byte {have}", want.path));
    }
    let bar = progress_bar(total, want.path);
    bar.set_position(have);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match resp.body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = out.flush();
                bar.abandon();
                return Err(Failure::Interrupted(anyhow::anyhow!(
                    "the transfer stopped at byte {}: {e}",
                    fs::metadata(partial).map_or(have, |m| m.len())
                )));
            }
        };
        out.write_all(&buf[..n])
            .with_context(|| format!("writing {}", partial.display()))
            .map_err(fatal)?;
        bar.inc(n as u64);
    }
    out.sync_all()
        .with_context(|| format!("writing {}", partial.display()))
        .map_err(fatal)?;
    bar.finish_and_clear();
    Ok(())
}

fn progress_bar(total: Option<u64>, name: &str) -> indicatif::ProgressBar {
    let bar = match total {
        Some(t) => indicatif::ProgressBar::new(t),
        None => indicatif::ProgressBar::no_length(),
    };
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style);
    }
    bar.set_message(name.rsplit('/').next().unwrap_or(name).to_owned());
    bar
}
