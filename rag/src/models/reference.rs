//! Hugging Face Hub model references: `hf.co/OWNER/REPO:QUANT`, `hf.co/OWNER/REPO/FILE.gguf`
//! and `hf.co/OWNER/REPO` (the repository's only GGUF, else its Q4_K_M), and how one picks
//! a file from a repository's listing.

use anyhow::{bail, Result};
use std::fmt;
use std::path::{Path, PathBuf};

/// The quant tag a reference without one picks when the repository holds several GGUFs
/// (as ollama does).
const DEFAULT_QUANT: &str = "Q4_K_M";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubRef {
    pub owner: String,
    pub repo: String,
    pub selector: Selector,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// The GGUF whose name carries this quant tag (case-insensitive), e.g. `Q4_K_M`.
    Quant(String),
    /// This file (a path inside the repository).
    File(String),
    /// The only GGUF, else the one tagged [`DEFAULT_QUANT`].
    Default,
}

/// A file of a Hub repository as its listing gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubFile {
    pub path: String,
    pub size: u64,
    /// The LFS object id (sha256); `None` for a file kept in git itself.
    pub sha256: Option<String>,
}

impl HubRef {
    /// Whether `s` is written as a Hub reference (then [`HubRef::parse`] says if it is valid).
    pub fn looks_like(s: &str) -> bool {
        strip_host(s).is_some()
    }

    pub fn parse(s: &str) -> Result<HubRef> {
        let Some(rest) = strip_host(s) else {
            bail!("'{s}' is not a Hub reference (hf.co/OWNER/REPO:QUANT or hf.co/OWNER/REPO/FILE.gguf)");
        };
        let bad = || {
            anyhow::anyhow!(
                "'{s}' is not a valid Hub reference: expected hf.co/OWNER/REPO:QUANT or hf.co/OWNER/REPO/FILE.gguf"
            )
        };
        let (owner, rest) = rest.split_once('/').ok_or_else(bad)?;
        let (repo, selector) = match rest.split_once('/') {
            Some((repo, file)) => {
                if !safe_path(file) {
                    return Err(bad());
                }
                if !file.to_ascii_lowercase().ends_with(".gguf") {
                    bail!("'{s}': name a .gguf file (hf.co/OWNER/REPO/FILE.gguf) or a quant tag (hf.co/OWNER/REPO:QUANT)");
                }
                (repo, Selector::File(file.to_owned()))
            }
            None => match rest.split_once(':') {
                Some((repo, quant)) if valid_tag(quant) => {
                    (repo, Selector::Quant(quant.to_owned()))
                }
                Some(_) => return Err(bad()),
                None => (rest, Selector::Default),
            },
        };
        if !valid_name(owner) || !valid_name(repo) {
            return Err(bad());
        }
        Ok(HubRef {
            owner: owner.to_owned(),
            repo: repo.to_owned(),
            selector,
        })
    }

    /// `OWNER/REPO`, as the Hub's URLs name it.
    pub fn repo_id(&self) -> String {
        format!("{}/{}", self.owner, self.repo)
    }

    /// Where this repository's files are cached: `<cache>/hf/OWNER/REPO/`.
    pub fn cache_dir(&self, cache: &Path) -> PathBuf {
        cache.join("hf").join(&self.owner).join(&self.repo)
    }

    /// The file this reference names among `files` (a listing), or an error that lists the
    /// candidates.
    pub fn choose<'a>(&self, files: &'a [HubFile]) -> Result<&'a HubFile> {
        let ggufs: Vec<&HubFile> = files.iter().filter(|f| is_model_gguf(&f.path)).collect();
        let names = || {
            if ggufs.is_empty() {
                "it holds no GGUF model file".to_owned()
            } else {
                let list: Vec<&str> = ggufs.iter().map(|f| f.path.as_str()).collect();
                format!("its GGUF files: {}", list.join(", "))
            }
        };
        let tagged = |tag: &str| -> Vec<&'a HubFile> {
            files
                .iter()
                .filter(|f| is_model_gguf(&f.path) && carries_tag(&f.path, tag))
                .collect()
        };
        let pick = |matches: Vec<&'a HubFile>, what: &str| -> Result<&'a HubFile> {
            match matches[..] {
                [one] => Ok(one),
                [] => bail!(
                    "no GGUF file in hf.co/{} matches {what}; {}",
                    self.repo_id(),
                    names()
                ),
                _ => {
                    let list: Vec<&str> = matches.iter().map(|f| f.path.as_str()).collect();
                    bail!(
                        "{what} is ambiguous in hf.co/{}: it matches {}; name one as hf.co/{}/FILE.gguf",
                        self.repo_id(),
                        list.join(", "),
                        self.repo_id()
                    )
                }
            }
        };
        match &self.selector {
            Selector::File(path) => match files.iter().find(|f| &f.path == path) {
                Some(f) => Ok(f),
                None => bail!("hf.co/{} has no file {path}; {}", self.repo_id(), names()),
            },
            Selector::Quant(tag) => pick(tagged(tag), &format!("quant tag {tag}")),
            Selector::Default if ggufs.len() == 1 => Ok(ggufs[0]),
            Selector::Default => pick(
                tagged(DEFAULT_QUANT),
                &format!(
                    "the default quant tag {DEFAULT_QUANT} (name a tag as hf.co/OWNER/REPO:QUANT)"
                ),
            ),
        }
    }
}

impl fmt::Display for HubRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "hf.co/{}", self.repo_id())?;
        match &self.selector {
            Selector::Quant(q) => write!(f, ":{q}"),
            Selector::File(p) => write!(f, "/{p}"),
            Selector::Default => Ok(()),
        }
    }
}

fn strip_host(s: &str) -> Option<&str> {
    let s = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .unwrap_or(s);
    s.strip_prefix("hf.co/")
        .or_else(|| s.strip_prefix("huggingface.co/"))
}

/// Owner and repository names as the Hub allows them.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.len() <= 96
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

fn valid_tag(s: &str) -> bool {
    !s.is_empty() && s.len() <= 32 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A relative path that stays inside its directory, in portable characters.
pub(crate) fn safe_path(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && !p.contains('\\')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
        && !p.chars().any(|c| c.is_control())
}

/// A GGUF holding a model (vision projectors, `mmproj-*`, are not models on their own).
fn is_model_gguf(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    lower.ends_with(".gguf") && !lower.contains("mmproj")
}

/// Whether `tag` appears in the file name as a whole word: `Q4_K` is in `x.Q4_K.gguf` but
/// not in `x-Q4_K_M.gguf`, and `Q4_0` is not in `x-IQ4_0.gguf`.
fn carries_tag(path: &str, tag: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    let tag = tag.to_ascii_lowercase();
    let bytes = name.as_bytes();
    let mut from = 0;
    while let Some(at) = name[from..].find(&tag) {
        let start = from + at;
        let end = start + tag.len();
        let before_ok = start == 0 || !bytes[start - 1].is_ascii_alphanumeric();
        let after_ok =
            end == bytes.len() || !(bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_');
        if before_ok && after_ok {
            return true;
        }
        from = start + 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> HubFile {
        HubFile {
            path: path.to_owned(),
            size: 1,
            sha256: None,
        }
    }

    #[test]
    fn references_parse_and_print_back() {
        for s in [
            "hf.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:Q4_K_M",
            "hf.co/o/r/sub/model-q8_0.gguf",
            "hf.co/o/r",
        ] {
            assert_eq!(HubRef::parse(s).unwrap().to_string(), s);
        }
        let r = HubRef::parse("https://huggingface.co/o/r:q4_0").unwrap();
        assert_eq!(r.selector, Selector::Quant("q4_0".into()));
        assert_eq!(r.repo_id(), "o/r");
    }

    #[test]
    fn malformed_references_are_refused() {
        for s in [
            "hf.co/",
            "hf.co/o",
            "hf.co/o/",
            "hf.co/o/r:",
            "hf.co/o/r:Q4 K",
            "hf.co/../r:Q4_0",
            "hf.co/o/r/../x.gguf",
            "hf.co/o/r//x.gguf",
            "hf.co/o/r/README.md",
            "hf.co/o:x/r",
        ] {
            assert!(HubRef::parse(s).is_err(), "{s}");
        }
        assert!(!HubRef::looks_like("smollm2-135m"));
        assert!(!HubRef::looks_like("models/hf.co/x.gguf"));
    }

    #[test]
    fn quant_tags_match_whole_words_only() {
        let files = [
            file("m-Q4_K_M.gguf"),
            file("m-Q4_K_S.gguf"),
            file("m.Q4_K.gguf"),
            file("m-IQ4_0.gguf"),
            file("m-Q4_0.gguf"),
            file("mmproj-m-Q4_0.gguf"),
            file("README.md"),
        ];
        let pick = |s: &str| {
            HubRef::parse(s)
                .unwrap()
                .choose(&files)
                .map(|f| f.path.clone())
        };
        assert_eq!(pick("hf.co/o/r:q4_k_m").unwrap(), "m-Q4_K_M.gguf");
        assert_eq!(pick("hf.co/o/r:Q4_K").unwrap(), "m.Q4_K.gguf");
        assert_eq!(pick("hf.co/o/r:Q4_0").unwrap(), "m-Q4_0.gguf");
        assert_eq!(pick("hf.co/o/r").unwrap(), "m-Q4_K_M.gguf");
        let err = pick("hf.co/o/r:Q8_0").unwrap_err().to_string();
        assert!(
            err.contains("no GGUF file") && err.contains("m-Q4_K_S.gguf"),
            "{err}"
        );
        assert!(!err.contains("mmproj") && !err.contains("README"), "{err}");
    }

    #[test]
    fn an_ambiguous_tag_lists_the_candidates() {
        let files = [file("a/m-Q4_K_M.gguf"), file("b/m-Q4_K_M.gguf")];
        let err = HubRef::parse("hf.co/o/r:Q4_K_M")
            .unwrap()
            .choose(&files)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ambiguous")
                && err.contains("a/m-Q4_K_M.gguf")
                && err.contains("b/m-Q4_K_M.gguf"),
            "{err}"
        );
    }
}
