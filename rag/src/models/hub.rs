//! The Hugging Face Hub over HTTP(S): the repository listing from its API and files from
//! its resolve URLs, configured as the Hub's own tools are (`HF_ENDPOINT`, `HF_TOKEN`,
//! `HF_HUB_OFFLINE`).
//!
//! Redirects are followed here rather than by the HTTP client so the token goes to the
//! configured endpoint's origin only: the Hub answers resolve URLs with a redirect to a
//! storage host, which must not see it.

use super::reference::{safe_path, HubFile};
use anyhow::{bail, Context, Result};
use std::time::Duration;

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// Redirects followed per request (the Hub uses one or two).
const MAX_REDIRECTS: usize = 8;
/// Pages of a repository listing read at most (the Hub sends 1000 files a page).
const MAX_PAGES: usize = 100;

pub struct Hub {
    endpoint: String,
    token: Option<String>,
    offline: bool,
    agent: ureq::Agent,
}

/// A response being read: its status, total length when known, and body.
pub struct Download {
    pub status: u16,
    /// `Content-Length` of this response.
    pub length: Option<u64>,
    /// The first byte of a `206 Partial Content` response (`Content-Range`).
    pub range_start: Option<u64>,
    pub body: ureq::BodyReader<'static>,
}

/// The Hub could not be reached at all (as opposed to answering with an error).
#[derive(Debug)]
pub struct Unreachable(pub String);

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unreachable {}

impl Hub {
    /// From the environment: `HF_ENDPOINT` (default [`DEFAULT_ENDPOINT`]), `HF_TOKEN`,
    /// `HF_HUB_OFFLINE=1`.
    pub fn from_env() -> Result<Hub> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned());
        let mut hub = Hub::new(&endpoint, var("HF_TOKEN"))?;
        hub.offline = var("HF_HUB_OFFLINE").is_some_and(|v| v != "0" && v != "false");
        Ok(hub)
    }

    pub fn new(endpoint: &str, token: Option<String>) -> Result<Hub> {
        let endpoint = endpoint.trim().trim_end_matches('/').to_owned();
        if origin(&endpoint).is_none() {
            bail!("HF_ENDPOINT '{endpoint}' is not an http:// or https:// URL");
        }
        let agent = ureq::Agent::config_builder()
            // A machine without the Hub fails over to the mirror quickly.
            .timeout_resolve(Some(Duration::from_secs(5)))
            .timeout_connect(Some(Duration::from_secs(5)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            // A stalled transfer is an interruption to resume, not a hang.
            .timeout_per_read(Some(Duration::from_secs(60)))
            .max_redirects(0)
            .http_status_as_error(false)
            .user_agent(concat!("rag/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(Hub {
            endpoint,
            token: token.map(|t| t.trim().to_owned()),
            offline: false,
            agent,
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Every file of `repo_id` (`OWNER/REPO`) on its main branch.
    pub fn list(&self, repo_id: &str) -> Result<Vec<HubFile>> {
        let mut url = format!(
            "{}/api/models/{}/tree/main?recursive=true",
            self.endpoint,
            encode_path(repo_id)
        );
        let mut files = Vec::new();
        // Long listings come in pages, the next one named by a `Link: <URL>; rel="next"`.
        for _ in 0..MAX_PAGES {
            let mut resp = self.get(&url, None)?;
            match resp.status().as_u16() {
                200 => {}
                401 | 403 | 404 => bail!(
                    "hf.co/{repo_id} was not found on {} (HTTP {}){}",
                    self.endpoint,
                    resp.status().as_u16(),
                    if self.token.is_some() {
                        ""
                    } else {
                        ": check the name; a private or gated repository needs HF_TOKEN"
                    }
                ),
                s => bail!("listing hf.co/{repo_id} on {}: HTTP {s}", self.endpoint),
            }
            let next = resp
                .headers()
                .get("link")
                .and_then(|v| v.to_str().ok())
                .and_then(next_page);
            let text = resp
                .body_mut()
                .with_config()
                .limit(64 << 20)
                .read_to_string()
                .with_context(|| format!("reading the listing of hf.co/{repo_id}"))?;
            files.extend(
                parse_listing(&text)
                    .with_context(|| format!("the Hub's listing of hf.co/{repo_id}"))?,
            );
            match next {
                Some(next) => url = join(&url, &next)?,
                None => return Ok(files),
            }
        }
        bail!("the listing of hf.co/{repo_id} has more than {MAX_PAGES} pages")
    }

    /// `GET` a file of `repo_id`, from byte `from` on when given.
    pub fn download(&self, repo_id: &str, path: &str, from: Option<u64>) -> Result<Download> {
        let url = format!(
            "{}/{}/resolve/main/{}",
            self.endpoint,
            encode_path(repo_id),
            encode_path(path)
        );
        let resp = self.get(&url, from)?;
        let status = resp.status().as_u16();
        let header = |k: &str| {
            resp.headers()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let length = header("content-length").and_then(|v| v.trim().parse().ok());
        // `bytes START-END/TOTAL`
        let range_start = header("content-range").and_then(|v| {
            v.trim()
                .strip_prefix("bytes ")?
                .split('-')
                .next()?
                .parse()
                .ok()
        });
        Ok(Download {
            status,
            length,
            range_start,
            body: resp.into_body().into_reader(),
        })
    }

    /// `GET url`, following redirects; the token only to the endpoint's origin.
    fn get(&self, url: &str, from: Option<u64>) -> Result<ureq::http::Response<ureq::Body>> {
        if self.offline {
            return Err(Unreachable(format!(
                "HF_HUB_OFFLINE is set, so {} is not contacted",
                self.endpoint
            ))
            .into());
        }
        let home = origin(&self.endpoint);
        let mut url = url.to_owned();
        for _ in 0..=MAX_REDIRECTS {
            let mut req = self.agent.get(&url);
            if let (Some(token), true) = (&self.token, origin(&url) == home) {
                req = req.header("Authorization", format!("Bearer {token}"));
            }
            if let Some(from) = from.filter(|&f| f > 0) {
                req = req.header("Range", format!("bytes={from}-"));
            }
            let resp = match req.call() {
                Ok(r) => r,
                Err(ureq::Error::Io(e)) => {
                    return Err(Unreachable(format!("cannot reach {url}: {e}")).into())
                }
                Err(
                    e @ (ureq::Error::HostNotFound
                    | ureq::Error::ConnectionFailed
                    | ureq::Error::Timeout(_)),
                ) => return Err(Unreachable(format!("cannot reach {url}: {e}")).into()),
                Err(e) => return Err(e).with_context(|| format!("GET {url}")),
            };
            if !resp.status().is_redirection() {
                return Ok(resp);
            }
            let location = resp
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .with_context(|| format!("GET {url}: a redirect without a location"))?;
            url = join(&url, location)?;
        }
        bail!("GET {url}: more than {MAX_REDIRECTS} redirects")
    }
}

/// The Hub's tree listing: `[{"type":"file","path":..,"size":..,"lfs":{"oid":SHA256}}, ..]`.
pub(crate) fn parse_listing(text: &str) -> Result<Vec<HubFile>> {
    let items: Vec<serde_json::Value> =
        serde_json::from_str(text).context("not a JSON array of files")?;
    let mut out = Vec::new();
    for item in items {
        if item.get("type").and_then(|t| t.as_str()) != Some("file") {
            continue;
        }
        let Some(path) = item.get("path").and_then(|p| p.as_str()) else {
            continue;
        };
        // A listing is remote input: a path that would leave the cache is skipped.
        if !safe_path(path) {
            continue;
        }
        let lfs = item.get("lfs");
        let sha256 = lfs
            .and_then(|l| l.get("oid"))
            .and_then(|o| o.as_str())
            .map(|o| o.strip_prefix("sha256:").unwrap_or(o).to_ascii_lowercase())
            .filter(|o| o.len() == 64 && o.bytes().all(|b| b.is_ascii_hexdigit()));
        let size = lfs
            .and_then(|l| l.get("size"))
            .or_else(|| item.get("size"))
            .and_then(|s| s.as_u64())
            .unwrap_or(0);
        out.push(HubFile {
            path: path.to_owned(),
            size,
            sha256,
        });
    }
    Ok(out)
}

/// The URL of a `Link` header's `rel="next"` entry.
fn next_page(link: &str) -> Option<String> {
    link.split(',').find_map(|entry| {
        let (url, params) = entry.split_once(';')?;
        params
            .split(';')
            .any(|p| p.trim().replace(' ', "") == "rel=\"next\"")
            .then(|| {
                url.trim()
                    .trim_start_matches('<')
                    .trim_end_matches('>')
                    .to_owned()
            })
    })
}

/// `scheme://host[:port]`, lowercased, of an http(s) URL.
fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.is_empty() {
        return None;
    }
    Some(format!("{scheme}://{}", authority.to_ascii_lowercase()))
}

/// The URL a redirect's `Location` points to, seen from `base`.
fn join(base: &str, location: &str) -> Result<String> {
    if origin(location).is_some() {
        return Ok(location.to_owned());
    }
    let home = origin(base).context("redirect from a URL without an origin")?;
    if let Some(rest) = location.strip_prefix("//") {
        let scheme = home.split("://").next().unwrap_or("https");
        return Ok(format!("{scheme}://{rest}"));
    }
    if location.starts_with('/') {
        return Ok(format!("{home}{location}"));
    }
    let path_end = base.find(['?', '#']).unwrap_or(base.len());
    let dir = &base[..base[..path_end].rfind('/').unwrap_or(path_end) + 1];
    Ok(format!("{dir}{location}"))
}

/// Percent-encodes each `/`-separated segment.
fn encode_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for b in p.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_decide_where_the_token_goes() {
        assert_eq!(
            origin("https://HuggingFace.co/api/x?y=1").as_deref(),
            Some("https://huggingface.co")
        );
        assert_ne!(
            origin("http://127.0.0.1:1/a"),
            origin("http://127.0.0.1:2/a")
        );
        assert_ne!(origin("http://h/a"), origin("https://h/a"));
        assert!(origin("ftp://h/a").is_none());
        assert!(Hub::new("file:///tmp", None).is_err());
    }

    #[test]
    fn redirect_locations_resolve_against_the_request() {
        let base = "https://h.co/o/r/resolve/main/f.gguf?x=1";
        assert_eq!(join(base, "https://cdn.x/a").unwrap(), "https://cdn.x/a");
        assert_eq!(join(base, "/api/b").unwrap(), "https://h.co/api/b");
        assert_eq!(join(base, "//cdn.x/c").unwrap(), "https://cdn.x/c");
        assert_eq!(
            join(base, "g.gguf").unwrap(),
            "https://h.co/o/r/resolve/main/g.gguf"
        );
    }

    #[test]
    fn the_listing_gives_lfs_hashes_and_skips_unsafe_paths() {
        let sha = "a".repeat(64);
        let text = format!(
            r#"[{{"type":"file","path":"m.gguf","size":134,"oid":"x","lfs":{{"oid":"{sha}","size":999,"pointerSize":134}}}},
                {{"type":"file","path":"README.md","size":10,"oid":"y"}},
                {{"type":"directory","path":"sub","size":0,"oid":"z"}},
                {{"type":"file","path":"../evil.gguf","size":1,"oid":"w"}}]"#
        );
        let files = parse_listing(&text).unwrap();
        assert_eq!(
            files,
            vec![
                HubFile {
                    path: "m.gguf".into(),
                    size: 999,
                    sha256: Some(sha)
                },
                HubFile {
                    path: "README.md".into(),
                    size: 10,
                    sha256: None
                },
            ]
        );
        assert!(parse_listing("{\"error\":\"x\"}").is_err());
    }

    #[test]
    fn the_next_page_comes_from_the_link_header() {
        assert_eq!(
            next_page(r#"<https://h.co/api/models/o/r/tree/main?cursor=abc>; rel="next""#)
                .as_deref(),
            Some("https://h.co/api/models/o/r/tree/main?cursor=abc")
        );
        assert_eq!(
            next_page(r#"<https://h/p1>; rel="prev", <https://h/p3>; rel = "next""#).as_deref(),
            Some("https://h/p3")
        );
        assert_eq!(next_page(r#"<https://h/p1>; rel="prev""#), None);
    }

    #[test]
    fn paths_are_percent_encoded() {
        assert_eq!(encode_path("o/r/a b+c.gguf"), "o/r/a%20b%2Bc.gguf");
    }
}
