//! The repacked-weights cache gives the same model as repacking (bit-identical logits),
//! and a damaged, truncated, stale or unwritable cache never breaks a load: the model is
//! repacked and the cache rewritten.

mod common;

use common::{logit_bits as logits, model_or_skip as model};
use npu_runtime::session::{LoadOptions, Model};
use npu_runtime::weights_cache::{cache_path, CacheOutcome, WeightsCache};
use std::path::Path;
use std::sync::Arc;

fn load(path: &Path, weights_cache: WeightsCache) -> Arc<Model> {
    let opts = LoadOptions {
        threads: 2,
        weights_cache,
        ..LoadOptions::default()
    };
    Model::load(path, &opts).unwrap()
}

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
    assert_eq!(first.weights_cache(), CacheOutcome::Writing(file.clone()));
    assert_eq!(
        first.wait_weights_cache(),
        CacheOutcome::Written(file.clone())
    );
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
    assert_eq!(
        plain.wait_weights_cache(),
        CacheOutcome::Written(file.clone())
    );
    let screened = load_with(false);
    assert!(screened.weights().lm_screen.is_some());
    assert_eq!(
        screened.weights_cache(),
        CacheOutcome::Writing(file.clone())
    );
    assert_eq!(
        screened.wait_weights_cache(),
        CacheOutcome::Written(file.clone())
    );
    let again = load_with(false);
    assert!(again.weights().lm_screen.is_some());
    assert_eq!(again.weights_cache(), CacheOutcome::Hit(file));
    // A plain-head load is served by a cache that holds more than it needs.
    assert_eq!(
        load_with(true).weights_cache(),
        CacheOutcome::Hit(cache_path(dir.path(), &path))
    );
}

/// A cache that does not match its model is ignored and rewritten.
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
    let rebuilt = |what: &str| {
        let m = load(&gguf, cache.clone());
        assert!(
            matches!(m.weights_cache(), CacheOutcome::Writing(_)),
            "{what}: {:?}",
            m.weights_cache()
        );
        assert!(logits(&m) == want, "{what}: logits changed");
        assert_eq!(m.wait_weights_cache(), CacheOutcome::Written(file.clone()));
    };
    rebuilt("no cache yet");

    let mut bytes = std::fs::read(&file).unwrap();
    bytes[20] ^= 1;
    std::fs::write(&file, &bytes).unwrap();
    rebuilt("damaged header");

    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    rebuilt("truncated file");

    // The model file changes (same bytes, a new modification time): the cache is stale.
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&gguf)
        .unwrap()
        .set_modified(later)
        .unwrap();
    rebuilt("model file modified");

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
    assert!(
        matches!(m.weights_cache(), CacheOutcome::Writing(_)),
        "same-layout file"
    );
    m.wait_weights_cache();

    let m = load(&gguf, cache);
    assert_eq!(m.weights_cache(), CacheOutcome::Hit(file));
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
