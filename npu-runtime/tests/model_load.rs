//! Loading on several threads builds the same model: the logits of a real model loaded
//! with 1 and with 3 loader threads agree bit for bit (every matrix of every layer and
//! both vocabulary matrices take part in them).

mod common;

use common::{logit_bits, model_or_skip};
use npu_runtime::session::{LoadOptions, Model};

#[test]
fn loader_thread_count_does_not_change_the_model() {
    let Some(path) = model_or_skip("smollm2-135m") else {
        return;
    };
    // The session's compute threads equal the loader's; the kernels are thread-count
    // invariant (tested elsewhere), so a difference here can only come from loading.
    let load = |threads| {
        let opts = LoadOptions::with_threads(threads);
        Model::load(&path, &opts).unwrap()
    };
    let (one, three) = (logit_bits(&load(1)), logit_bits(&load(3)));
    assert_eq!(one.len(), three.len());
    assert!(one == three, "logits differ between 1 and 3 loader threads");
}
