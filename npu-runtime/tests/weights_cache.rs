//! The repacked-weights cache gives the same model as repacking (bit-identical logits),
//! and a damaged (header or data), truncated, stale, old-format or unwritable cache never
//! breaks a load: the model is repacked and the cache rewritten, and damage is reported.

mod common;

use common::{logit_bits as logits, model_or_skip as model, xorshift};
use npu_runtime::kernels::ThreadPool;
use npu_runtime::session::{LoadOptions, Model};
use npu_runtime::weights_cache::checksum::{data_checksum, Streaming, CHUNK};
use npu_runtime::weights_cache::{cache_path, CacheOutcome, WeightsCache};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn load(path: &Path, weights_cache: WeightsCache) -> Arc<Model> {
    load_on(path, weights_cache, 2)
}

fn load_on(path: &Path, weights_cache: WeightsCache, threads: usize) -> Arc<Model> {
    let opts = LoadOptions {
        threads,
        weights_cache,
        ..LoadOptions::default()
    };
    Model::load(path, &opts).unwrap()
}

fn writing(path: &Path, damage: Option<&str>) -> CacheOutcome {
    CacheOutcome::Writing {
        path: path.to_path_buf(),
        damage: damage.map(str::to_string),
    }
}

fn written(path: &Path, damage: Option<&str>) -> CacheOutcome {
    CacheOutcome::Written {
        path: path.to_path_buf(),
        damage: damage.map(str::to_string),
    }
}

const DATA_DAMAGED: &str = "its data does not match its checksum";

/// Qwen2.5-0.5B Q4_K_M mixes Q4_K, Q5_0, Q6_K and Q8_0 matrices.
#[test]
fn cached_weights_give_the_same_model() {
    let Some(path) = model("qwen2.5-coder-0.5b") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = WeightsCache::Dir(dir.path().to_path_buf());
    let want = logits(&load(&path, WeightsCache::Off));

    let first = load(&path, cache.clone());
    let file = cache_path(dir.path(), &path);
    assert_eq!(first.weights_cache(), writing(&file, None));
    assert_eq!(first.wait_weights_cache(), written(&file, None));
    assert!(
        logits(&first) == want,
        "repacked model changed after writing the cache"
    );

    let second = load(&path, cache);
    assert_eq!(second.weights_cache(), CacheOutcome::Hit(file));
    assert!(
        logits(&second) == want,
        "cached weights differ from repacked ones"
    );
    // The LM head's screen comes from the cache too, the same bytes.
    let coarse = |m: &Model| {
        let s = m
            .weights()
            .lm_screen
            .as_ref()
            .expect("the 0.5B's head gets a screen");
        s.coarse().repacked_bytes().to_vec()
    };
    assert!(coarse(&second) == coarse(&first), "cached screen differs");
}

/// A cache written without the LM head's screen (a plain-head load, an older build) is
/// rewritten with it by the first load that builds one, and hit after that.
#[test]
fn a_cache_without_the_screen_is_rewritten_with_it() {
    let Some(path) = model("qwen2.5-coder-0.5b") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = cache_path(dir.path(), &path);
    let load_with = |plain_lm_head: bool| {
        let opts = LoadOptions {
            threads: 2,
            weights_cache: WeightsCache::Dir(dir.path().to_path_buf()),
            plain_lm_head,
        };
        Model::load(&path, &opts).unwrap()
    };
    let plain = load_with(true);
    assert!(plain.weights().lm_screen.is_none());
    assert_eq!(plain.wait_weights_cache(), written(&file, None));
    let screened = load_with(false);
    assert!(screened.weights().lm_screen.is_some());
    assert_eq!(screened.weights_cache(), writing(&file, None));
    assert_eq!(screened.wait_weights_cache(), written(&file, None));
    let again = load_with(false);
    assert!(again.weights().lm_screen.is_some());
    assert_eq!(again.weights_cache(), CacheOutcome::Hit(file));
    // A plain-head load is served by a cache that holds more than it needs.
    assert_eq!(
        load_with(true).weights_cache(),
        CacheOutcome::Hit(cache_path(dir.path(), &path))
    );
}

/// A cache that does not match its model is ignored and rewritten; a damaged one is
/// reported as such, a stale or old-format one is not.
#[test]
fn damaged_or_stale_caches_are_rebuilt() {
    let Some(src) = model("smollm2-135m") else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let gguf = work.path().join("model.gguf");
    std::fs::copy(&src, &gguf).unwrap();
    let dir = work.path().join("cache");
    let cache = WeightsCache::Dir(dir.clone());
    let want = logits(&load(&gguf, WeightsCache::Off));
    let file = cache_path(&dir, &gguf);
    let rebuilt = |what: &str, damage: Option<&str>| {
        let m = load(&gguf, cache.clone());
        assert_eq!(m.weights_cache(), writing(&file, damage), "{what}");
        assert!(logits(&m) == want, "{what}: logits changed");
        assert_eq!(m.wait_weights_cache(), written(&file, damage), "{what}");
    };
    rebuilt("no cache yet", None);

    let mut bytes = std::fs::read(&file).unwrap();
    bytes[20] ^= 1;
    std::fs::write(&file, &bytes).unwrap();
    rebuilt(
        "damaged header",
        Some("its header does not match its checksum"),
    );

    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    rebuilt("truncated file", Some("the file is cut short"));

    // A cache of the previous format version (no data checksum): a plain rebuild.
    let mut bytes = std::fs::read(&file).unwrap();
    assert_eq!(&bytes[..8], b"RAGRPK\0\x02");
    bytes[7] = 1;
    std::fs::write(&file, &bytes).unwrap();
    rebuilt("previous format version", None);

    // The model file changes (same bytes, a new modification time): the cache is stale.
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&gguf)
        .unwrap()
        .set_modified(later)
        .unwrap();
    rebuilt("model file modified", None);

    // Another model file with the same layout and the same modification time: a changed
    // weight byte (the first of a tensor's data) is enough to miss.
    let mtime = std::fs::metadata(&gguf).unwrap().modified().unwrap();
    let first = {
        let g = graphs::gguf::GgufFile::open(&gguf).unwrap();
        g.tensor("output_norm.weight").unwrap().offset as usize
    };
    let mut model_bytes = std::fs::read(&gguf).unwrap();
    model_bytes[first] ^= 1;
    std::fs::write(&gguf, &model_bytes).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&gguf)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let m = load(&gguf, cache.clone());
    assert_eq!(m.weights_cache(), writing(&file, None), "same-layout file");
    m.wait_weights_cache();

    let m = load(&gguf, cache);
    assert_eq!(m.weights_cache(), CacheOutcome::Hit(file));
}

/// One flipped bit in the data part of a written cache (in a matrix near its end, or
/// anywhere in its middle) is caught before the weights are used: the next load repacks
/// (the same model as a fresh load), says the file was damaged and rewrites it, and the
/// load after that maps the new file.
#[test]
fn a_flipped_data_bit_is_caught_and_the_cache_rebuilt() {
    let Some(path) = model("smollm2-135m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = WeightsCache::Dir(dir.path().to_path_buf());
    let want = logits(&load(&path, WeightsCache::Off));
    let file = cache_path(dir.path(), &path);
    load(&path, cache.clone()).wait_weights_cache();
    let clean = std::fs::read(&file).unwrap();
    // The file ends where the last matrix ends: its last byte is a weight byte.
    for at in [clean.len() - 1, clean.len() / 2] {
        let mut bytes = clean.clone();
        bytes[at] ^= 0x04;
        std::fs::write(&file, &bytes).unwrap();

        let m = load(&path, cache.clone());
        assert_eq!(
            m.weights_cache(),
            writing(&file, Some(DATA_DAMAGED)),
            "{at}"
        );
        assert!(
            logits(&m) == want,
            "byte {at}: logits differ from a fresh load"
        );
        assert_eq!(m.wait_weights_cache(), written(&file, Some(DATA_DAMAGED)));
        assert!(
            std::fs::read(&file).unwrap() == clean,
            "byte {at}: not rewritten"
        );

        let m = load(&path, cache.clone());
        assert_eq!(m.weights_cache(), CacheOutcome::Hit(file.clone()));
        assert!(logits(&m) == want, "byte {at}: rewritten cache differs");
    }
}

/// The data checksum does not depend on how many threads hash it: a cache written by
/// the one background thread is accepted by loads on 1 to 4 threads, and the parallel
/// checksum of any bytes equals the one-thread streaming checksum fed in odd pieces.
#[test]
fn the_checksum_is_the_same_for_any_thread_count() {
    let pools: Vec<ThreadPool> = (1..=4).map(ThreadPool::new).collect();
    let bytes: Vec<u8> = xorshift(0x9E37_79B9_7F4A_7C15)
        .take(5 * CHUNK + 123)
        .map(|x| x as u8)
        .collect();
    for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, bytes.len()] {
        let data = &bytes[..len];
        let sums: Vec<u64> = pools.iter().map(|p| data_checksum(data, p)).collect();
        assert!(sums.iter().all(|&s| s == sums[0]), "{len} bytes: {sums:x?}");
        let mut streaming = Streaming::default();
        let mut at = 0;
        for step in [1, 4095, CHUNK + 3, 17].iter().cycle() {
            if at == len {
                break;
            }
            let end = len.min(at + step);
            streaming.update(&data[at..end]);
            at = end;
        }
        assert_eq!(streaming.finish(), sums[0], "{len} bytes streamed");
        if len > 0 {
            let mut changed = data.to_vec();
            changed[len / 2] ^= 0x80;
            assert_ne!(data_checksum(&changed, &pools[1]), sums[0], "{len} bytes");
        }
    }

    let Some(path) = model("smollm2-135m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = WeightsCache::Dir(dir.path().to_path_buf());
    load(&path, cache.clone()).wait_weights_cache();
    let file: PathBuf = cache_path(dir.path(), &path);
    for threads in 1..=4 {
        let m = load_on(&path, cache.clone(), threads);
        assert_eq!(
            m.weights_cache(),
            CacheOutcome::Hit(file.clone()),
            "{threads} threads"
        );
    }
}

/// Two processes' worth of first loads at once: both work, and the cache they leave is valid.
#[test]
fn concurrent_first_loads_agree() {
    let Some(path) = model("smollm2-135m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let want = logits(&load(&path, WeightsCache::Off));
    let results: Vec<Vec<u32>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let m = load(&path, WeightsCache::Dir(dir.path().to_path_buf()));
                    m.wait_weights_cache();
                    logits(&m)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(results.iter().all(|r| *r == want));
    let m = load(&path, WeightsCache::Dir(dir.path().to_path_buf()));
    assert!(matches!(m.weights_cache(), CacheOutcome::Hit(_)));
    assert!(logits(&m) == want);
    let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(leftovers, 1, "temporary files left behind");
}

/// A cache directory that cannot be created: the model loads and says why nothing was cached.
#[test]
fn unwritable_cache_dir_still_loads() {
    let Some(path) = model("smollm2-135m") else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let not_a_dir = work.path().join("file");
    std::fs::write(&not_a_dir, b"x").unwrap();
    let m = load(&path, WeightsCache::Dir(not_a_dir.join("cache")));
    assert!(matches!(
        m.wait_weights_cache(),
        CacheOutcome::NotWritten(_)
    ));
    assert!(logits(&m) == logits(&load(&path, WeightsCache::Off)));
}
