//! On-disk cache of finalized context binaries, keyed by model hash, block, graph shape,
//! QNN build and lowering version. Each entry is the binary plus a small text file with
//! the graph's application tensors (execution matches tensors by id, so the ids must be
//! stored with the binary).

use crate::error::{QnnError, QnnResult};
use crate::graph::{DType, GraphOptions, IoTensor, WeightFormat};
use crate::lower::LOWERING_VERSION;
use graphs::ir::{BlockSpec, GraphShape};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// 64-bit FNV-1a over a file's bytes: a content key for the model (not cryptographic;
/// a collision would only reuse a stale cache entry of a same-sized, same-named block).
pub fn file_hash(path: &Path) -> std::io::Result<u64> {
    let mut f = std::fs::File::open(path)?;
    let mut h = graphs::fnv::Fnv1a::default();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.write(&buf[..n]);
    }
    Ok(h.0)
}

/// File stem of one cache entry.
pub fn entry_key(model_hash: u64, block: &BlockSpec, shape: GraphShape, build_id: &str) -> String {
    let build: String = build_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(48)
        .collect();
    format!(
        "{model_hash:016x}-L{}-{}{}{}-T{}-C{}-{build}-v{LOWERING_VERSION}",
        block.layers.start,
        block.layers.end,
        if block.first { "f" } else { "" },
        if block.last { "l" } else { "" },
        shape.tokens,
        shape.kv_capacity
    )
}

/// The cache-key suffix of non-default graph options (empty for the defaults, so default
/// entries keep their keys).
pub fn options_key(o: &GraphOptions) -> String {
    let mut key = String::new();
    if o.precision.is_some() || o.optimization.is_some() {
        key.push_str(&format!(
            "-p{}o{}",
            o.precision.map_or(9, |p| p as u8),
            o.optimization.unwrap_or(0)
        ));
    }
    if o.weights == WeightFormat::S8PerChannel {
        key.push_str("-ws8c");
    }
    key
}

/// A directory of cached binaries.
#[derive(Clone, Debug)]
pub struct BinaryCache {
    dir: PathBuf,
}

/// A cached graph: context binary and its I/O description.
pub struct CachedGraph {
    pub binary: Vec<u8>,
    pub inputs: Vec<IoTensor>,
    pub outputs: Vec<IoTensor>,
}

impl BinaryCache {
    pub fn new(dir: PathBuf) -> Self {
        BinaryCache { dir }
    }

    /// `qnn-htp/contexts/` next to the libraries.
    /// `$RAG_QNN_CONTEXT_DIR`, else `contexts/` next to the QNN libraries.
    pub fn default_dir() -> PathBuf {
        std::env::var_os("RAG_QNN_CONTEXT_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| crate::library::lib_dir().join("contexts"))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry for `key`, or None if absent or unreadable (a corrupt entry is a miss).
    pub fn get(&self, key: &str) -> Option<CachedGraph> {
        let binary = std::fs::read(self.dir.join(format!("{key}.bin"))).ok()?;
        let text = std::fs::read_to_string(self.dir.join(format!("{key}.io"))).ok()?;
        let (inputs, outputs) = parse_io(&text).ok()?;
        Some(CachedGraph {
            binary,
            inputs,
            outputs,
        })
    }

    /// Stores an entry atomically (write to temp files, then rename). The temp names are
    /// unique per call, not only per process: two sessions of one process that compile the
    /// same graph at once would otherwise write into the same temp file and rename it
    /// under each other.
    pub fn put(&self, key: &str, g: &CachedGraph) -> QnnResult<()> {
        static PUTS: AtomicU64 = AtomicU64::new(0);
        let io = |e: std::io::Error| {
            QnnError::Invalid(format!("context cache {}: {e}", self.dir.display()))
        };
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        let n = PUTS.fetch_add(1, Ordering::Relaxed);
        let tmp = |ext: &str| {
            self.dir
                .join(format!(".{key}.{}.{n}.{ext}", std::process::id()))
        };
        std::fs::write(tmp("bin"), &g.binary).map_err(io)?;
        std::fs::write(tmp("io"), format_io(&g.inputs, &g.outputs)).map_err(io)?;
        std::fs::rename(tmp("io"), self.dir.join(format!("{key}.io"))).map_err(io)?;
        std::fs::rename(tmp("bin"), self.dir.join(format!("{key}.bin"))).map_err(io)?;
        Ok(())
    }
}

/// One line per tensor: `in|out id name dtype dim,dim,...`.
fn format_io(inputs: &[IoTensor], outputs: &[IoTensor]) -> String {
    let mut s = String::new();
    for (tag, list) in [("in", inputs), ("out", outputs)] {
        for t in list {
            let dims: Vec<String> = t.dims.iter().map(|d| d.to_string()).collect();
            s.push_str(&format!(
                "{tag} {} {} {} {}\n",
                t.id,
                t.name,
                t.dtype.code(),
                dims.join(",")
            ));
        }
    }
    s
}

fn parse_io(text: &str) -> Result<(Vec<IoTensor>, Vec<IoTensor>), String> {
    let mut ins = Vec::new();
    let mut outs = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() != 5 {
            return Err(format!("bad line {line:?}"));
        }
        let t = IoTensor {
            id: f[1].parse().map_err(|_| "bad id")?,
            name: f[2].to_string(),
            dtype: f[3]
                .parse::<u8>()
                .ok()
                .and_then(DType::from_code)
                .ok_or("bad dtype")?,
            dims: f[4]
                .split(',')
                .map(|d| d.parse::<u32>().map_err(|_| "bad dim"))
                .collect::<Result<_, _>>()?,
        };
        match f[0] {
            "in" => ins.push(t),
            "out" => outs.push(t),
            _ => return Err(format!("bad tag {}", f[0])),
        }
    }
    Ok((ins, outs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_description_round_trips_and_rejects_garbage() {
        let ins = vec![IoTensor {
            id: 3,
            name: "t0".into(),
            dims: vec![4, 576],
            dtype: DType::F16,
        }];
        let outs = vec![IoTensor {
            id: 9,
            name: "t7".into(),
            dims: vec![4],
            dtype: DType::I32,
        }];
        let (a, b) = parse_io(&format_io(&ins, &outs)).unwrap();
        assert_eq!((a, b), (ins, outs));
        assert!(parse_io("in 1 t0 0\n").is_err());
        assert!(parse_io("in x t0 0 1\n").is_err());
        assert!(parse_io("in 1 t0 9 1\n").is_err());
    }

    #[test]
    fn cache_round_trip_and_keys_differ_by_shape_and_block() {
        let dir = tempfile::tempdir().unwrap();
        let c = BinaryCache::new(dir.path().join("ctx"));
        let b = BlockSpec {
            layers: 0..2,
            first: true,
            last: false,
        };
        let k1 = entry_key(1, &b, GraphShape::new(1, 64), "v2.51.0");
        let k2 = entry_key(1, &b, GraphShape::new(4, 64), "v2.51.0");
        let k3 = entry_key(
            1,
            &BlockSpec {
                layers: 0..2,
                first: false,
                last: false,
            },
            GraphShape::new(1, 64),
            "v2.51.0",
        );
        let k4 = entry_key(2, &b, GraphShape::new(1, 64), "v2.51.0");
        assert!(k1 != k2 && k1 != k3 && k1 != k4);
        assert!(c.get(&k1).is_none());
        let g = CachedGraph {
            binary: vec![1, 2, 3],
            inputs: vec![],
            outputs: vec![],
        };
        c.put(&k1, &g).unwrap();
        let r = c.get(&k1).unwrap();
        assert_eq!(r.binary, vec![1, 2, 3]);
        std::fs::write(c.dir().join(format!("{k1}.io")), "garbage").unwrap();
        assert!(c.get(&k1).is_none());
    }

    #[test]
    fn concurrent_puts_of_one_key_all_succeed_and_leave_a_whole_entry() {
        let dir = tempfile::tempdir().unwrap();
        let c = BinaryCache::new(dir.path().to_path_buf());
        let entry = |byte: u8| CachedGraph {
            binary: vec![byte; 1 << 20],
            inputs: vec![],
            outputs: vec![],
        };
        let (a, b) = (entry(1), entry(2));
        for _ in 0..20 {
            std::thread::scope(|s| {
                let ha = s.spawn(|| c.put("k", &a));
                let hb = s.spawn(|| c.put("k", &b));
                ha.join().unwrap().unwrap();
                hb.join().unwrap().unwrap();
            });
            let got = c.get("k").unwrap().binary;
            assert!(
                got == a.binary || got == b.binary,
                "a mixed or partial entry"
            );
        }
        // No temp file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn option_keys_keep_defaults_and_separate_weight_formats() {
        use crate::graph::Precision;
        let d = GraphOptions::default();
        assert_eq!(options_key(&d), "");
        let s8 = GraphOptions {
            weights: WeightFormat::S8PerChannel,
            ..d
        };
        let o3 = GraphOptions {
            optimization: Some(3),
            ..d
        };
        let o3s8 = GraphOptions {
            weights: WeightFormat::S8PerChannel,
            ..o3
        };
        let p16 = GraphOptions {
            precision: Some(Precision::Float16),
            ..d
        };
        let keys: Vec<String> = [s8, o3, o3s8, p16].iter().map(options_key).collect();
        // The earlier suffix of a precision/optimization setting is unchanged.
        assert_eq!(keys[1], "-p9o3");
        for (i, a) in keys.iter().enumerate() {
            assert!(!a.is_empty());
            assert!(keys[i + 1..].iter().all(|b| a != b), "{keys:?}");
        }
    }

    #[test]
    fn file_hash_depends_on_content() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"hello").unwrap();
        std::fs::write(&b, b"hellp").unwrap();
        assert_ne!(file_hash(&a).unwrap(), file_hash(&b).unwrap());
        assert_eq!(file_hash(&a).unwrap(), file_hash(&a).unwrap());
    }
}
