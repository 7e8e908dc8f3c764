//! Multi-sequence decoding: N branches continue one committed context together, one forward
//! per step advancing all of them (test-time scaling on the spare rows of a batch).
//!
//! The shared prompt is prefilled once. Each branch's own tokens stay in scratch rows after
//! the committed context ("held" rows, interleaved across branches); a branch's row sees the
//! committed slots and then its own tail, in slot order. That is the key sequence the same
//! branch decoded alone sees, so by batch invariance every branch's logits, and its tokens,
//! equal plain decoding's bit for bit.

use super::{GenerationStats, Session, StopReason};
use crate::attention::TreeRoot;
use crate::backend::{Backend, LogitsRows};
use crate::error::{Result, RuntimeError};
use crate::kernels::{detected, vector::softmax_exp_with_isa};
use std::time::Instant;

/// Largest branch batch: every graph ladder holds 64 rows at most.
const MAX_BRANCHES: usize = 64;

impl<B: Backend> Session<B> {
    /// Scratch rows that branch batches hold after the committed context.
    pub fn held_rows(&self) -> usize {
        self.held
    }

    /// One forward over one new token per branch. Row i continues its branch after the
    /// held rows `tails[i]` (ascending offsets of the branch's earlier tokens, empty for
    /// its first: a child of the last committed token) at position `n_past +
    /// tails[i].len()`. The new rows are held at offsets `held_rows()..` for later steps
    /// until [`Session::release_branches`] or any other forward, commit or rollback.
    /// Returns `tokens.len() x vocab` logits.
    pub fn forward_branches(&mut self, tokens: &[u32], tails: &[&[u16]]) -> Result<&[f32]> {
        let n = tokens.len();
        if tails.len() != n {
            return Err(RuntimeError::InvalidInput(format!(
                "{n} branch tokens but {} tails",
                tails.len()
            )));
        }
        let shape = self.decode_batch_shape("branch", tokens)?;
        let held = self.held;
        if held + n > self.kv.free() {
            return Err(RuntimeError::Capacity(format!(
                "{n} branch tokens do not fit after {held} held rows: {} of {} KV slots used",
                self.kv.n_past(),
                self.kv.capacity()
            )));
        }
        self.ensure_decode_forms()?;
        self.last_batch = 0;
        let roots = [-1i32; MAX_BRANCHES];
        self.mask
            .set_tree_after_held(held, &roots[..n], |i| TreeRoot {
                held_visible: tails[i],
                depth: tails[i].len(),
            })?;
        self.stage_tokens(tokens, shape);
        self.run_with_head(shape, LogitsRows::All, None)?;
        self.held = held + n;
        let v = self.model.vocab_size();
        Ok(&self.logits[..n * v])
    }

    /// Drops the rows branch batches hold; the committed context stays.
    pub fn release_branches(&mut self) {
        self.held = 0;
    }
}

/// One branch of [`decode_branches`].
#[derive(Clone, Debug)]
pub struct BranchOutput {
    /// Generated tokens (an end-of-generation token is not included).
    pub tokens: Vec<u32>,
    /// Sum over `tokens` of each token's log-probability under the model's untempered
    /// softmax (natural log): the selectors' confidence score.
    pub logprob: f64,
    pub stop: StopReason,
}

impl BranchOutput {
    /// Mean log-probability per generated token (0 for an empty branch).
    pub fn mean_logprob(&self) -> f64 {
        if self.tokens.is_empty() {
            0.0
        } else {
            self.logprob / self.tokens.len() as f64
        }
    }
}

/// Decodes `picks.len()` branches after prefilling `prompt`: branch b chooses generated
/// token i with `picks[b](logits, i)`. The branches still running advance together, one
/// forward per step; a branch stops at an end-of-generation token, at `max_tokens`, or
/// when `on_token(b, token)` returns false, and then leaves the batch. Every branch's
/// tokens equal [`super::generate_picked`] with its pick alone. Afterwards the session
/// holds the prompt committed and no branch rows. `stats.generated` counts every branch's
/// tokens; `steps` counts forward steps and `decode_tok_s` is steps per second.
pub fn decode_branches<B: Backend, P: FnMut(&[f32], usize) -> u32>(
    session: &mut Session<B>,
    prompt: &[u32],
    max_tokens: usize,
    picks: &mut [P],
    mut on_token: impl FnMut(usize, u32) -> bool,
) -> Result<(Vec<BranchOutput>, GenerationStats)> {
    let n_b = picks.len();
    if n_b == 0 || n_b > session.opts.max_verify.min(MAX_BRANCHES) {
        return Err(RuntimeError::InvalidInput(format!(
            "{n_b} branches: must be 1..={}",
            session.opts.max_verify.min(MAX_BRANCHES)
        )));
    }
    let t0 = Instant::now();
    let mut scratch = Vec::new();
    let logits = session.prefill(prompt, 0)?.logits;
    let mut branches: Vec<Branch> = picks
        .iter_mut()
        .map(|pick| {
            let tok = pick(logits, 0);
            Branch::new(tok, logprob_of(logits, tok, &mut scratch))
        })
        .collect();
    let prefill = t0.elapsed();
    let t1 = Instant::now();
    let result = run_branches(
        session,
        &mut branches,
        picks,
        max_tokens,
        &mut on_token,
        &mut scratch,
    );
    session.release_branches();
    let steps = result?;
    let decode = t1.elapsed();
    let generated = branches.iter().map(|b| b.out.tokens.len()).sum();
    let outputs: Vec<BranchOutput> = branches
        .into_iter()
        .map(|b| BranchOutput {
            stop: b.stop.unwrap_or(StopReason::MaxTokens),
            ..b.out
        })
        .collect();
    let stop = outputs
        .iter()
        .map(|o| o.stop)
        .find(|&s| s != StopReason::EndOfGeneration)
        .unwrap_or(StopReason::EndOfGeneration);
    Ok((
        outputs,
        GenerationStats::new(prompt.len(), generated, prefill, decode, steps, stop),
    ))
}

/// The decode loop of [`decode_branches`]; returns the forward steps run.
fn run_branches<B: Backend, P: FnMut(&[f32], usize) -> u32>(
    session: &mut Session<B>,
    branches: &mut [Branch],
    picks: &mut [P],
    max_tokens: usize,
    on_token: &mut impl FnMut(usize, u32) -> bool,
    scratch: &mut Vec<f32>,
) -> Result<usize> {
    let v = session.model().vocab_size();
    let mut steps = 0;
    loop {
        // Emit each running branch's pending token, as the plain decode loop does.
        for (b, br) in branches.iter_mut().enumerate() {
            if br.stop.is_none() {
                br.emit(b, max_tokens, session, on_token);
            }
        }
        let live: Vec<usize> = (0..branches.len())
            .filter(|&b| branches[b].stop.is_none())
            .collect();
        if live.is_empty() {
            return Ok(steps);
        }
        if session.held_rows() + live.len() > session.kv.free() {
            for &b in &live {
                branches[b].stop = Some(StopReason::ContextFull);
            }
            return Ok(steps);
        }
        let first_row = session.held_rows();
        let tokens: Vec<u32> = live.iter().map(|&b| branches[b].pending).collect();
        let tails: Vec<&[u16]> = live.iter().map(|&b| &branches[b].tail[..]).collect();
        let logits = session.forward_branches(&tokens, &tails)?;
        for (r, &b) in live.iter().enumerate() {
            let row = &logits[r * v..(r + 1) * v];
            let br = &mut branches[b];
            br.tail.push((first_row + r) as u16);
            let tok = picks[b](row, br.out.tokens.len());
            br.pending = tok;
            br.pending_logprob = logprob_of(row, tok, scratch);
        }
        steps += 1;
    }
}

/// A branch in flight: its pending token (chosen, not yet emitted or fed back) and the
/// held-row offsets of the tokens it has fed back.
struct Branch {
    pending: u32,
    pending_logprob: f64,
    tail: Vec<u16>,
    out: BranchOutput,
    stop: Option<StopReason>,
}

impl Branch {
    fn new(pending: u32, pending_logprob: f64) -> Self {
        Branch {
            pending,
            pending_logprob,
            tail: Vec::new(),
            out: BranchOutput {
                tokens: Vec::new(),
                logprob: 0.0,
                stop: StopReason::MaxTokens,
            },
            stop: None,
        }
    }

    /// Emits the pending token or stops, in the order of the plain decode loop.
    fn emit<B: Backend>(
        &mut self,
        b: usize,
        max_tokens: usize,
        session: &Session<B>,
        on_token: &mut impl FnMut(usize, u32) -> bool,
    ) {
        let generated = self.out.tokens.len();
        self.stop = if generated == max_tokens {
            Some(StopReason::MaxTokens)
        } else if session.model().is_eog(self.pending) {
            Some(StopReason::EndOfGeneration)
        } else {
            self.out.tokens.push(self.pending);
            self.out.logprob += self.pending_logprob;
            if !on_token(b, self.pending) {
                Some(StopReason::Callback)
            } else if generated + 1 == max_tokens {
                Some(StopReason::MaxTokens)
            } else {
                None
            }
        };
    }
}

/// `ln softmax(logits)[tok]` (untempered), with the runtime's vectorised exponential.
fn logprob_of(logits: &[f32], tok: u32, scratch: &mut Vec<f32>) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    scratch.clear();
    scratch.extend_from_slice(logits);
    let sum = softmax_exp_with_isa(detected(), scratch, 1.0);
    (logits[tok as usize] - max) as f64 - (sum as f64).ln()
}
