//! `--samples` and `--select`, shared by `rag ask` and `rag chat`.

use rag::assistant::{AskOptions, Sampling};
use rag::select::Selector;

/// The temperature of `--samples` when none is given (greedy samples would all agree).
const SAMPLES_TEMPERATURE: f32 = 0.7;

#[derive(clap::Args)]
pub struct SampleArgs {
    /// Sample this many answers in one batched decode and keep one (`--select`); the
    /// answer then prints once the samples are done. Samples need a temperature: at
    /// `--temperature 0` (the default) they use 0.7.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub samples: u16,
    /// How to keep one of several samples: the answer most samples agree on (`vote`), the
    /// one the model is most confident in (`logprob`, mean log-probability), or the one
    /// the model judges correct when asked after each (`verify`, one short prefill per
    /// distinct answer).
    #[arg(long, default_value = "vote", value_parser = Selector::NAMES)]
    pub select: String,
}

impl SampleArgs {
    /// Sets the samples and the selector on `ask`, and a temperature if several samples
    /// would otherwise be greedy.
    pub fn apply(&self, ask: &mut AskOptions) {
        ask.samples = self.samples.into();
        ask.select = Selector::parse(&self.select).unwrap_or_default();
        if ask.samples > 1 && ask.sampling.is_greedy() {
            ask.sampling = Sampling {
                temperature: SAMPLES_TEMPERATURE,
                ..ask.sampling
            };
        }
    }

    /// The line printed after an answer kept from several samples (`None` for one).
    pub fn summary(ask: &AskOptions, answer: &rag::assistant::Answer) -> Option<String> {
        let best = answer.candidates.iter().find(|c| c.text == answer.answer)?;
        Some(format!(
            "({} samples, kept by {}: {} agree, mean log-probability {:.2})",
            answer.candidates.len(),
            ask.select.name(),
            best.votes,
            best.mean_logprob
        ))
    }
}
