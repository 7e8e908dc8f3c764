//! A stand-in for the Hugging Face Hub on 127.0.0.1, made by the tests: the tree listing
//! (`/api/models/OWNER/REPO/tree/main`), resolve URLs (`/OWNER/REPO/resolve/main/FILE`,
//! with HTTP ranges) and, for redirects to another host, `/cdn/FILE`. It records every
//! request so a test can check what was asked and which headers came along.
// Each test file uses its own subset.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone)]
pub struct Served {
    pub path: String,
    pub bytes: Arc<Vec<u8>>,
    /// The sha256 the listing gives as the LFS oid.
    pub listed_sha: String,
}

impl Served {
    pub fn new(path: &str, bytes: Vec<u8>, listed_sha: &str) -> Served {
        Served {
            path: path.to_owned(),
            bytes: Arc::new(bytes),
            listed_sha: listed_sha.to_owned(),
        }
    }
}

#[derive(Clone, Default)]
pub struct Config {
    /// `OWNER/REPO`; other repositories are 404.
    pub repo_id: String,
    pub files: Vec<Served>,
    /// The first full (non-range) file response stops after this many bytes and closes the
    /// connection, though its Content-Length promised the whole file.
    pub cut_first_at: Option<usize>,
    /// Resolve URLs answer with a redirect to `{redirect_to}/cdn/FILE`.
    pub redirect_to: Option<String>,
    /// A pause half way through each file body.
    pub body_pause: Duration,
    /// Files per listing page (0: one page), the next page named by a `Link` header.
    pub page_size: usize,
}

#[derive(Debug, Clone)]
pub struct Request {
    pub path: String,
    pub range: Option<String>,
    pub authorization: Option<String>,
}

pub struct Server {
    pub url: String,
    pub requests: Arc<Mutex<Vec<Request>>>,
}

impl Server {
    pub fn start(config: Config) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = requests.clone();
        let config = Arc::new(config);
        let cut_done = Arc::new(AtomicBool::new(false));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (config, log, cut_done) = (config.clone(), log.clone(), cut_done.clone());
                std::thread::spawn(move || {
                    let _ = serve(stream, &config, &log, &cut_done);
                });
            }
        });
        Server { url, requests }
    }

    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// The requests for file bytes (resolve or CDN URLs).
    pub fn file_requests(&self) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| r.path.contains("/resolve/main/") || r.path.starts_with("/cdn/"))
            .collect()
    }
}

/// Deterministic bytes that start like a GGUF file.
pub fn fake_gguf(len: usize, seed: u8) -> Vec<u8> {
    let mut v = b"GGUF".to_vec();
    v.extend((0..len.saturating_sub(4)).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)));
    v
}

fn serve(
    stream: TcpStream,
    config: &Config,
    log: &Mutex<Vec<Request>>,
    cut_done: &AtomicBool,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let target = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let (mut range, mut authorization) = (None, None);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "range" => range = Some(v.trim().to_owned()),
                "authorization" => authorization = Some(v.trim().to_owned()),
                _ => {}
            }
        }
    }
    log.lock().unwrap().push(Request {
        path: target.clone(),
        range: range.clone(),
        authorization,
    });
    let mut out = stream;
    let path = target.split('?').next().unwrap_or("");
    let listing = format!("/api/models/{}/tree/main", config.repo_id);
    let resolve = format!("/{}/resolve/main/", config.repo_id);
    if path == listing {
        let cursor: usize = target
            .split_once("cursor=")
            .and_then(|(_, c)| c.parse().ok())
            .unwrap_or(0);
        let end = match config.page_size {
            0 => config.files.len(),
            n => (cursor + n).min(config.files.len()),
        };
        let link = if end < config.files.len() {
            format!("Link: <{listing}?recursive=true&cursor={end}>; rel=\"next\"\r\n")
        } else {
            String::new()
        };
        let items: Vec<String> = config.files[cursor..end]
            .iter()
            .map(|f| {
                format!(
                    r#"{{"type":"file","oid":"0000","size":134,"path":"{}","lfs":{{"oid":"{}","size":{},"pointerSize":134}}}}"#,
                    f.path,
                    f.listed_sha,
                    f.bytes.len()
                )
            })
            .collect();
        let body = format!("[{}]", items.join(","));
        return respond(&mut out, "200 OK", &link, body.as_bytes());
    }
    let file = |name: &str| config.files.iter().find(|f| f.path == name);
    if let Some(name) = path.strip_prefix(&resolve) {
        if let (Some(to), Some(_)) = (&config.redirect_to, file(name)) {
            let loc = format!("Location: {to}/cdn/{name}\r\n");
            return respond(&mut out, "302 Found", &loc, b"");
        }
        return send_file(&mut out, file(name), range.as_deref(), config, cut_done);
    }
    if let Some(name) = path.strip_prefix("/cdn/") {
        return send_file(&mut out, file(name), range.as_deref(), config, cut_done);
    }
    respond(&mut out, "404 Not Found", "", b"{\"error\":\"not found\"}")
}

fn respond(out: &mut TcpStream, status: &str, headers: &str, body: &[u8]) -> std::io::Result<()> {
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n",
        body.len()
    )?;
    out.write_all(body)?;
    out.flush()
}

fn send_file(
    out: &mut TcpStream,
    file: Option<&Served>,
    range: Option<&str>,
    config: &Config,
    cut_done: &AtomicBool,
) -> std::io::Result<()> {
    let Some(file) = file else {
        return respond(out, "404 Not Found", "", b"Entry not found");
    };
    let len = file.bytes.len();
    let start = range
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|s| s.parse::<usize>().ok());
    let (status, from, extra) = match start {
        Some(s) if s >= len => {
            let h = format!("Content-Range: bytes */{len}\r\n");
            return respond(out, "416 Range Not Satisfiable", &h, b"");
        }
        Some(s) => (
            "206 Partial Content",
            s,
            format!("Content-Range: bytes {s}-{}/{len}\r\n", len - 1),
        ),
        None => ("200 OK", 0, String::new()),
    };
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
        len - from
    )?;
    let body = &file.bytes[from..];
    if start.is_none() {
        if let Some(cut) = config.cut_first_at {
            if !cut_done.swap(true, Ordering::SeqCst) {
                out.write_all(&body[..cut])?;
                out.flush()?;
                return out.shutdown(std::net::Shutdown::Both);
            }
        }
    }
    let half = body.len() / 2;
    out.write_all(&body[..half])?;
    out.flush()?;
    std::thread::sleep(config.body_pause);
    out.write_all(&body[half..])?;
    out.flush()
}
