//! The verify-cost curve cached per model, thread count, machine and engine build.
//!
//! Profiling costs a few seconds of verify forwards at start-up, and a profile taken
//! during a busy moment distorts every budget after it; a cached curve from a quiet
//! moment is both cheaper and steadier. A cached curve is used only when every part
//! of its key equals the current one:
//! - the model file's fingerprint (size + FNV-1a of its first and last 4 MiB: a
//!   re-quantization or another file under the same name changes it),
//! - the compute thread count,
//! - the machine (CPU model and logical CPU count),
//! - the engine version: this crate's version, the SIMD kernel set in use and
//!   the size and modification time of the running executable, so any rebuild (kernel
//!   changes alter the curve) profiles again.
//!
//! Otherwise the curve is profiled and the file replaced. One file per model stem and
//! thread count: `<dir>/verify-<stem>-t<threads>.json`, holding `{key, curve}`. Beside it,
//! under the same key, `verify-<stem>-t<threads>.learned.json` holds what a generator
//! learned on that curve ([`learned_file`]), so the next process starts from it.

use crate::budget::CostCurve;
use crate::generate::Learned;
use crate::SpecError;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Everything a measured verify-cost curve depends on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CurveKey {
    pub model_fingerprint: String,
    pub threads: usize,
    pub machine: String,
    pub engine: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct CachedCurve {
    key: CurveKey,
    curve: CostCurve,
}

/// Where a curve came from, for reports.
#[derive(Clone, Debug, PartialEq)]
pub enum CurveSource {
    /// Read from this cache file (its key matched).
    Cached(PathBuf),
    /// Measured in this run; `why` says why no cached curve was used.
    Profiled { why: String },
}

impl std::fmt::Display for CurveSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CurveSource::Cached(p) => write!(f, "cached ({})", p.display()),
            CurveSource::Profiled { why } => write!(f, "profiled in this run ({why})"),
        }
    }
}

const EDGE: u64 = 4 << 20;

/// Size + FNV-1a over the first and last 4 MiB of a model file.
pub fn model_fingerprint(path: &Path) -> Result<String, SpecError> {
    let io = |e: std::io::Error| SpecError::Config(format!("{}: {e}", path.display()));
    let mut f = std::fs::File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let mut h = graphs::fnv::Fnv1a::default();
    let mut buf = Vec::new();
    (&mut f).take(EDGE).read_to_end(&mut buf).map_err(io)?;
    h.write(&buf);
    if len > EDGE {
        buf.clear();
        f.seek(SeekFrom::Start(len.saturating_sub(EDGE).max(EDGE)))
            .map_err(io)?;
        f.take(EDGE).read_to_end(&mut buf).map_err(io)?;
        h.write(&buf);
    }
    Ok(format!("{len}-{:016x}", h.0))
}

/// This crate's version, the kernel set and the running executable's size and
/// modification time (a rebuild re-profiles).
pub fn engine_version() -> String {
    let exe = std::env::current_exe()
        .and_then(std::fs::metadata)
        .map(|m| {
            let t = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            format!("{}-{t}", m.len())
        })
        .unwrap_or_else(|_| "unknown".into());
    format!(
        "specdec {} {:?} exe {exe}",
        env!("CARGO_PKG_VERSION"),
        npu_runtime::kernels::simd::detected()
    )
}

impl CurveKey {
    /// The key for `model` at `threads` on this machine and engine build.
    pub fn current(model: &Path, threads: usize) -> Result<Self, SpecError> {
        Ok(CurveKey {
            model_fingerprint: model_fingerprint(model)?,
            threads,
            machine: npu_runtime::schedule::machine_id(),
            engine: engine_version(),
        })
    }

    /// The key of a curve measured on another backend than the CPU: `backend` names it
    /// and its graph shapes (e.g. `qnn-htp v16`), so its curve is cached apart.
    pub fn on_backend(mut self, backend: &str) -> Self {
        if backend != "cpu" {
            self.engine.push_str(" backend ");
            self.engine.push_str(backend);
        }
        self
    }

    /// What differs from `other`, for reports ("" when equal).
    fn difference(&self, other: &CurveKey) -> String {
        let mut d = Vec::new();
        if self.model_fingerprint != other.model_fingerprint {
            d.push("model file");
        }
        if self.threads != other.threads {
            d.push("threads");
        }
        if self.machine != other.machine {
            d.push("machine");
        }
        if self.engine != other.engine {
            d.push("engine build");
        }
        d.join(", ")
    }
}

/// Cache file of a model's curve on `backend` (`cpu`: [`cache_file`]).
pub fn backend_cache_file(dir: &Path, model: &Path, threads: usize, backend: &str) -> PathBuf {
    let f = cache_file(dir, model, threads);
    if backend == "cpu" {
        return f;
    }
    let tag: String = backend
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    f.with_extension(format!("{tag}.json"))
}

/// Cache file of a model (by file stem) at a thread count.
pub fn cache_file(dir: &Path, model: &Path, threads: usize) -> PathBuf {
    let stem: String = model
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("verify-{stem}-t{threads}.json"))
}

/// The cached curve at `file` if its key equals `key`; else why not.
pub fn load(file: &Path, key: &CurveKey) -> Result<CostCurve, String> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err("no cached curve".into()),
        Err(e) => return Err(format!("cache unreadable: {e}")),
    };
    let c: CachedCurve =
        serde_json::from_str(&text).map_err(|e| format!("cache file invalid: {e}"))?;
    let diff = key.difference(&c.key);
    if !diff.is_empty() {
        return Err(format!("cached curve is stale: {diff} changed"));
    }
    CostCurve::new(c.curve.sizes, c.curve.ms).map_err(|e| format!("cache file invalid: {e}"))
}

/// Write the curve with its key (temp file + rename; creates the directory).
pub fn store(file: &Path, key: &CurveKey, curve: &CostCurve) -> Result<(), SpecError> {
    let text = serde_json::to_string(&CachedCurve {
        key: key.clone(),
        curve: curve.clone(),
    })
    .map_err(|e| SpecError::Config(e.to_string()))?;
    write_replacing(file, &text)
}

/// `text` into `file`, replaced whole ([`crate::atomic_file`]).
fn write_replacing(file: &Path, text: &str) -> Result<(), SpecError> {
    crate::atomic_file::write_replacing(file, text.as_bytes())
        .map_err(|e| SpecError::Config(format!("writing {}: {e}", file.display())))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct CachedLearned {
    key: CurveKey,
    learned: Learned,
}

/// Where what a generator learned is kept beside its curve's cache `curve_file`
/// (`verify-<stem>-t<threads>.json` -> `verify-<stem>-t<threads>.learned.json`).
/// It is rewritten after every answer, so it lives apart from the curve, which is
/// written once.
pub fn learned_file(curve_file: &Path) -> PathBuf {
    curve_file.with_extension("learned.json")
}

/// The learned state at `file` if it was saved under `key` (the same model, threads,
/// machine and engine build as the curve); else why not.
pub fn load_learned(file: &Path, key: &CurveKey) -> Result<Learned, String> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err("nothing learned yet".into())
        }
        Err(e) => return Err(format!("unreadable: {e}")),
    };
    let c: CachedLearned = serde_json::from_str(&text).map_err(|e| format!("invalid: {e}"))?;
    let diff = key.difference(&c.key);
    if !diff.is_empty() {
        return Err(format!("stale: {diff} changed"));
    }
    Ok(c.learned)
}

/// Save `learned` under `key` (replacing the file whole).
pub fn store_learned(file: &Path, key: &CurveKey, learned: &Learned) -> Result<(), SpecError> {
    let text = serde_json::to_string(&CachedLearned {
        key: key.clone(),
        learned: learned.clone(),
    })
    .map_err(|e| SpecError::Config(e.to_string()))?;
    write_replacing(file, &text)
}

/// The cached curve when valid and `reprofile` is false; else `profile()` it and
/// cache the result. Returns the curve and where it came from.
pub fn get_or_profile(
    file: &Path,
    key: &CurveKey,
    reprofile: bool,
    profile: impl FnOnce() -> Result<CostCurve, SpecError>,
) -> Result<(CostCurve, CurveSource), SpecError> {
    let why = if reprofile {
        "--reprofile".to_string()
    } else {
        match load(file, key) {
            Ok(c) => return Ok((c, CurveSource::Cached(file.to_path_buf()))),
            Err(why) => why,
        }
    };
    let c = profile()?;
    store(file, key, &c)?;
    Ok((c, CurveSource::Profiled { why }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::DEFAULT_SIZES;

    fn key() -> CurveKey {
        CurveKey {
            model_fingerprint: "10-abc".into(),
            threads: 2,
            machine: "cpu x2".into(),
            engine: "e1".into(),
        }
    }

    #[test]
    fn cached_curve_is_used_only_while_every_key_part_matches() {
        let dir = tempfile::tempdir().unwrap();
        let file = cache_file(dir.path(), Path::new("/m/My Model.gguf"), 2);
        assert!(file.ends_with("verify-My_Model-t2.json"));
        let c1 = CostCurve::affine(5.0, 1.0, &DEFAULT_SIZES);
        let c2 = CostCurve::affine(7.0, 2.0, &DEFAULT_SIZES);
        let (c, src) = get_or_profile(&file, &key(), false, || Ok(c1.clone())).unwrap();
        assert_eq!(c, c1);
        assert!(matches!(src, CurveSource::Profiled { ref why } if why == "no cached curve"));
        // Same key: the cache, the profiler is not called.
        let (c, src) = get_or_profile(&file, &key(), false, || panic!("profiled")).unwrap();
        assert_eq!((c, src), (c1.clone(), CurveSource::Cached(file.clone())));
        // Every key part invalidates.
        type Change = (fn(&mut CurveKey), &'static str);
        let changes: [Change; 4] = [
            (|k| k.model_fingerprint = "11-abc".into(), "model file"),
            (|k| k.threads = 1, "threads"),
            (|k| k.machine = "other".into(), "machine"),
            (|k| k.engine = "e2".into(), "engine build"),
        ];
        for (change, what) in changes {
            let mut k = key();
            change(&mut k);
            assert_eq!(
                load(&file, &k),
                Err(format!("cached curve is stale: {what} changed"))
            );
        }
        // --reprofile measures and replaces even a valid cache.
        let (c, src) = get_or_profile(&file, &key(), true, || Ok(c2.clone())).unwrap();
        assert_eq!(c, c2);
        assert_eq!(
            src,
            CurveSource::Profiled {
                why: "--reprofile".into()
            }
        );
        assert_eq!(load(&file, &key()), Ok(c2));
    }

    #[test]
    fn learned_state_is_kept_beside_the_curve_under_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let curve_file = cache_file(dir.path(), Path::new("/m/q.gguf"), 2);
        let file = learned_file(&curve_file);
        assert!(file.ends_with("verify-q-t2.learned.json"));
        assert_eq!(
            load_learned(&file, &key()).unwrap_err(),
            "nothing learned yet"
        );
        let curve = CostCurve::affine(5.0, 1.0, &DEFAULT_SIZES);
        let learned = crate::Generator::new(
            crate::Mode::Sdnpu,
            None,
            crate::GenConfig {
                cost_curve: Some(curve),
                ..Default::default()
            },
        )
        .learned();
        store_learned(&file, &key(), &learned).unwrap();
        assert!(load_learned(&file, &key()).unwrap() == learned);
        // No temp file is left behind, and the curve's own file is untouched.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("verify-q-t2.learned.json")]
        );
        let mut other = key();
        other.engine = "e2".into();
        assert_eq!(
            load_learned(&file, &other).unwrap_err(),
            "stale: engine build changed"
        );
        std::fs::write(&file, "{").unwrap();
        assert!(load_learned(&file, &key())
            .unwrap_err()
            .starts_with("invalid"));
    }

    #[test]
    fn corrupt_cache_files_are_reported_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("verify-m-t2.json");
        std::fs::write(&file, "garbage").unwrap();
        assert!(load(&file, &key())
            .unwrap_err()
            .starts_with("cache file invalid"));
        let bad = r#"{"key":{"model_fingerprint":"10-abc","threads":2,"machine":"cpu x2","engine":"e1"},"curve":{"sizes":[2],"ms":[1.0]}}"#;
        std::fs::write(&file, bad).unwrap();
        assert!(load(&file, &key())
            .unwrap_err()
            .starts_with("cache file invalid"));
        let c = CostCurve::affine(5.0, 1.0, &DEFAULT_SIZES);
        let (_, src) = get_or_profile(&file, &key(), false, || Ok(c.clone())).unwrap();
        assert!(matches!(src, CurveSource::Profiled { .. }));
        assert_eq!(load(&file, &key()), Ok(c));
    }

    #[test]
    fn fingerprint_reads_both_ends_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        let mut data = vec![7u8; (EDGE as usize) * 3];
        std::fs::write(&p, &data).unwrap();
        let a = model_fingerprint(&p).unwrap();
        // A change inside the middle is not seen (by design: cheap), one at the end is.
        data[EDGE as usize + 10] = 1;
        std::fs::write(&p, &data).unwrap();
        assert_eq!(model_fingerprint(&p).unwrap(), a);
        let n = data.len();
        data[n - 1] = 1;
        std::fs::write(&p, &data).unwrap();
        assert_ne!(model_fingerprint(&p).unwrap(), a);
        assert!(model_fingerprint(&dir.path().join("missing")).is_err());
        assert!(engine_version().starts_with("specdec "));
    }
}
