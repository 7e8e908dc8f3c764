//! The default hybrid fusion against its two inputs on a small fixture with the real
//! embedder: a mix of questions that name exact identifiers (BM25's strength) and
//! paraphrases that share few words with the text (dense retrieval's strength). The
//! default must rank at least as well as the better single method (MRR and recall@5).

use rag::embed::MiniLmEmbedder;
use rag::{Index, IndexOptions, SearchMode};
use std::sync::Arc;

fn model_dir() -> Option<std::path::PathBuf> {
    let dir = MiniLmEmbedder::default_dir();
    if dir.join("model.safetensors").is_file() {
        return Some(dir);
    }
    if std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        return None;
    }
    panic!(
        "{} missing: run `scripts/fetch-model.sh minilm-l6-v2`",
        dir.display()
    );
}

const DOCS: &[(&str, &str)] = &[
    ("kettle.txt", "Descaling the kettle. Limescale builds up where the water is hard. Fill the kettle halfway with equal parts white vinegar and water, bring it to the boil, leave it for an hour, then rinse it three times. Error code E17 on the base means the heating plate ran dry."),
    ("bike.txt", "Fixing a flat tyre. Remove the wheel, lever the tyre off the rim and pull out the inner tube. Pump a little air in and listen or feel for the leak; mark it, roughen the rubber with sandpaper, apply glue, wait until it is tacky and press the patch on firmly."),
    ("garden.txt", "Tomatoes in a cold spring. Sow seeds indoors six weeks before the last frost. Plant the seedlings out only when nights stay above ten degrees; cover them with fleece if a frost is forecast. Pinch out side shoots so the plant puts its energy into fruit."),
    ("backup.txt", "Backups with snapctl. Run snapctl --retain 14 to keep two weeks of daily snapshots. Snapshots are incremental, so each one only stores the blocks that changed since the previous one. Restore a single file with snapctl restore PATH."),
    ("network.txt", "Wireless network drops. If the laptop loses the wireless connection every few minutes, turn off power saving for the wifi adapter and move the router away from the microwave oven. Setting the channel width to 20 MHz helps in crowded apartment buildings."),
    ("bread.txt", "Sourdough starter. Mix flour and water in equal weight and keep it warm. Discard half and feed it every day; after about a week it doubles within six hours of a feed and is ready to raise a loaf. A layer of grey liquid on top means the starter is hungry."),
    ("car.txt", "Winter driving. Check the tyre tread and pressure before the cold season, keep the screenwash topped up with antifreeze, and carry a scraper. On ice brake gently and early; if the car skids, steer into the direction of the slide."),
    ("printer.txt", "Printer jams. Open the rear door and pull the sheet out in the direction of the paper path. Fan the stack before loading it. Status light pattern PX-42 blinking amber means the fuser is still hot: wait ten minutes before touching it."),
    ("sleep.txt", "Sleeping better. Keep the bedroom cool and dark, get up at the same hour every day, and avoid screens in the last hour before bed. Caffeine after midday can keep some people awake well into the night."),
    ("tax.txt", "Filing form TR-9. Self-employed people file form TR-9 by the end of January. Keep receipts for equipment; items under 500 euros can be deducted in full in the year they were bought. Late filing costs a fixed penalty of 100 euros."),
];

/// (question, file that answers it)
const QUESTIONS: &[(&str, &str)] = &[
    ("What does E17 mean?", "kettle.txt"),
    (
        "How do I get rid of chalky deposits in the thing I boil water in?",
        "kettle.txt",
    ),
    ("How can I repair a puncture on my bicycle?", "bike.txt"),
    (
        "When is it safe to move young tomato plants outside?",
        "garden.txt",
    ),
    ("snapctl --retain", "backup.txt"),
    (
        "How do I get back one file from an earlier copy of my data?",
        "backup.txt",
    ),
    (
        "My laptop keeps losing its internet connection",
        "network.txt",
    ),
    (
        "How do I know when my homemade yeast culture is ready for baking?",
        "bread.txt",
    ),
    (
        "What should I do when my vehicle slides on a frozen road?",
        "car.txt",
    ),
    ("PX-42 amber", "printer.txt"),
    ("Tips to fall asleep more easily", "sleep.txt"),
    ("What is the deadline for TR-9?", "tax.txt"),
];

/// (recall@5, MRR over the top 10) of one mode.
fn score(idx: &Index, mode: SearchMode) -> (f64, f64) {
    let (mut r5, mut mrr) = (0.0, 0.0);
    for (q, file) in QUESTIONS {
        let hits = idx.search(q, 10, mode).unwrap();
        let found = hits.iter().position(|h| h.path.ends_with(file));
        if found != Some(0) {
            // Printed so a failure shows which questions moved.
            eprintln!("{mode:?}: {q:?} -> rank {:?}", found.map(|p| p + 1));
        }
        if let Some(p) = found {
            r5 += (p < 5) as u32 as f64;
            mrr += 1.0 / (p + 1) as f64;
        }
    }
    let n = QUESTIONS.len() as f64;
    (r5 / n, mrr / n)
}

#[test]
fn default_hybrid_is_never_below_the_better_single_method() {
    let Some(dir) = model_dir() else { return };
    let corpus = tempfile::tempdir().unwrap();
    for (name, text) in DOCS {
        std::fs::write(corpus.path().join(name), text).unwrap();
    }
    let idx_dir = tempfile::tempdir().unwrap();
    let emb = Arc::new(MiniLmEmbedder::load_configured(&dir).unwrap());
    let idx = Index::open(idx_dir.path(), Some(emb)).unwrap();
    idx.add_paths(
        &[corpus.path().to_path_buf()],
        &IndexOptions::default(),
        &|_| {},
    )
    .unwrap();
    let bm25 = score(&idx, SearchMode::Bm25);
    let dense = score(&idx, SearchMode::Dense);
    let hybrid = score(&idx, SearchMode::Hybrid);
    eprintln!("recall@5, MRR: bm25 {bm25:?}, dense {dense:?}, hybrid {hybrid:?}");
    // The fixture separates the two inputs (with the real model: BM25 misses a paraphrase
    // and ranks another at 4, dense ranks every answer first), so the default must follow
    // the right list per question. Convex a=0.5 and this rule with a 0.1 weight floor fail.
    assert!(bm25.1 < dense.1 || dense.1 < bm25.1, "{bm25:?} {dense:?}");
    assert!(hybrid.0 >= bm25.0.max(dense.0), "recall@5 {hybrid:?}");
    assert!(hybrid.1 >= bm25.1.max(dense.1), "MRR {hybrid:?}");
}
