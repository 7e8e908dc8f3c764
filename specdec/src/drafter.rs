//! Draft sources behind one trait, and the drafting modes compared by the benchmark.

use crate::accept_model::{
    calibrated_match_strength, feature, match_strength, prob_strength, KIND_CALIB, KIND_DB,
    KIND_EXT, KIND_PLD, KIND_SELF, KIND_SELF_CAL,
};
use crate::calibration::Calibration;
use crate::extension::ExtensionStore;
use crate::pld::{pld_lookup, PLD_MAX_NGRAM, PLD_NUM_PRED};
use crate::sam::{MatchState, SuffixAutomaton};
use crate::target::PrefillOut;
use crate::tree::{DraftTree, FlatTree, SRC_CALIB, SRC_DB, SRC_EXT, SRC_PLD, SRC_SELF};
use crate::SpecError;
use std::sync::Arc;

/// Drafting mode. `SamCal` and `SamExt` exist for the ablation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    None,
    Pld,
    Sam,
    SamCal,
    SamExt,
    Sdnpu,
}

impl Mode {
    pub const ALL: [Mode; 6] = [
        Mode::None,
        Mode::Pld,
        Mode::Sam,
        Mode::SamCal,
        Mode::SamExt,
        Mode::Sdnpu,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Pld => "pld",
            Mode::Sam => "sam",
            Mode::SamCal => "sam+cal",
            Mode::SamExt => "sam+ext",
            Mode::Sdnpu => "sdnpu",
        }
    }

    pub fn parse(s: &str) -> Result<Mode, SpecError> {
        Mode::ALL
            .iter()
            .copied()
            .find(|m| m.name() == s.trim())
            .ok_or_else(|| {
                SpecError::Config(format!(
                    "unknown speculation mode '{s}' (expected none, pld, sam, sam+cal, sam+ext, sdnpu)"
                ))
            })
    }

    fn calibration(self) -> bool {
        matches!(self, Mode::SamCal | Mode::Sdnpu)
    }

    fn extension(self) -> bool {
        matches!(self, Mode::SamExt | Mode::Sdnpu)
    }
}

/// What the last verification revealed, for drafters that learn from rejections.
pub struct Feedback<'a> {
    pub flat: &'a FlatTree,
    pub argmax: &'a [u32],
    pub path: &'a [usize],
    pub step: u64,
}

/// A draft source.
pub trait Drafter {
    /// Top-k successors per prompt position this drafter wants from prefill.
    fn prefill_topk(&self) -> usize {
        0
    }
    /// The top-k rows are wanted for (at least) the last this many prompt positions.
    fn prefill_window(&self) -> usize {
        usize::MAX
    }
    /// New generation: the prompt and what prefill computed.
    fn begin(&mut self, prompt: &[u32], pre: &PrefillOut);
    /// Add candidates below the root of `tree` (the last token of `ctx`).
    /// `ctx` is the prompt followed by every emitted token.
    fn draft(&mut self, ctx: &[u32], tree: &mut DraftTree, step: u64);
    /// Tokens just appended to the context, with the verification that produced them
    /// (None for the token produced by prefill).
    fn observe(&mut self, emitted: &[u32], fb: Option<&Feedback<'_>>);
}

/// Plain decoding: no drafts.
#[derive(Default)]
pub struct NoDrafter;

impl Drafter for NoDrafter {
    fn begin(&mut self, _: &[u32], _: &PrefillOut) {}
    fn draft(&mut self, _: &[u32], _: &mut DraftTree, _: u64) {}
    fn observe(&mut self, _: &[u32], _: Option<&Feedback<'_>>) {}
}

/// Prompt lookup decoding over the whole context (prompt + output).
#[derive(Default)]
pub struct PldDrafter;

impl Drafter for PldDrafter {
    fn begin(&mut self, _: &[u32], _: &PrefillOut) {}
    fn draft(&mut self, ctx: &[u32], tree: &mut DraftTree, _: u64) {
        if let Some((n, cont)) = pld_lookup(ctx, PLD_MAX_NGRAM, PLD_NUM_PRED) {
            let base = if n >= 2 { 0.5 } else { 0.3 };
            tree.insert_feat(
                0,
                cont,
                |d| base * 0.9f32.powi(d as i32),
                |d| feature(KIND_PLD, n, d),
                SRC_PLD,
            );
        }
    }
    fn observe(&mut self, _: &[u32], _: Option<&Feedback<'_>>) {}
}

/// Prior probability that the first token after a suffix match of length `len`
/// is accepted (longer matches predict better; SAM-Decoding's threshold is 5).
pub fn match_confidence(len: usize) -> f32 {
    match len {
        0 => 0.0,
        1 => 0.2,
        2 => 0.35,
        3 => 0.45,
        4 => 0.55,
        5..=7 => 0.65,
        8..=15 => 0.75,
        _ => 0.85,
    }
}

/// Knobs of the suffix-automaton drafter.
#[derive(Clone, Debug)]
pub struct SamConfig {
    pub calibration: bool,
    pub extension: bool,
    /// Matches along the suffix-link chain drafted per automaton.
    pub self_branches: usize,
    pub db_branches: usize,
    /// Calibrated-tree branching per depth (then 1).
    pub calib_branch: Vec<usize>,
    /// Reused segments live this many steps (at least one).
    pub ext_lifetime: u64,
    pub ext_min_len: usize,
    pub ext_max_total: usize,
    /// Calibrate only the last this many prompt positions (`usize::MAX`: all). The
    /// top-k needs the full-vocabulary logits of every calibrated position, which
    /// is most of calibration's prefill cost.
    pub calib_window: usize,
    /// Calibrated confidence of own-context nodes (prefill rank of the text token).
    pub calib_confidence: bool,
    /// Calibrated DFS trees from the own matches' prompt positions.
    pub calib_trees: bool,
    /// Calibrated DFS follows the raw text first, the prefill's alternatives as branches.
    pub calib_follow_text: bool,
    /// Calibrated votes at short matches: when the longest own match is shorter than
    /// this, branch the root with the tokens the model itself preferred after every
    /// prompt occurrence of the matched suffix (0: off).
    pub calib_vote_below: usize,
    /// Root branches from the votes.
    pub calib_vote_width: usize,
    /// Further earlier occurrences of the longest own match (most recent first)
    /// drafted beside its first one (0: only the automaton's first occurrence).
    pub occurrences: usize,
}

impl SamConfig {
    pub fn for_mode(mode: Mode) -> Self {
        SamConfig {
            calibration: mode.calibration(),
            extension: mode.extension(),
            self_branches: 3,
            db_branches: 2,
            calib_branch: vec![2, 2],
            ext_lifetime: 4,
            ext_min_len: 2,
            ext_max_total: 32,
            calib_window: usize::MAX,
            calib_confidence: false,
            calib_trees: true,
            calib_follow_text: false,
            calib_vote_below: 0,
            calib_vote_width: 3,
            occurrences: 4,
        }
    }
}

/// SAM-Decoding drafter (self automaton + database automaton), optionally with
/// prefill calibration and rejected-token extension (= sd.npu's drafter).
pub struct SamDrafter {
    cfg: SamConfig,
    own: SuffixAutomaton,
    db: Option<Arc<SuffixAutomaton>>,
    db_match: MatchState,
    calib: Calibration,
    ext: ExtensionStore,
    prompt_len: usize,
    chain: Vec<(usize, usize)>,
    found: Vec<usize>,
    run: Vec<u32>,
}

impl SamDrafter {
    pub fn new(cfg: SamConfig, db: Option<Arc<SuffixAutomaton>>) -> Self {
        let ext = ExtensionStore::new(cfg.ext_lifetime, cfg.ext_min_len, cfg.ext_max_total);
        SamDrafter {
            cfg,
            own: SuffixAutomaton::new(),
            db,
            db_match: MatchState::default(),
            calib: Calibration::default(),
            ext,
            prompt_len: 0,
            chain: Vec::new(),
            found: Vec::new(),
            run: Vec::new(),
        }
    }

    /// Eq. 3 over a verified tree: the longest run of rejected rows on which the
    /// draft equalled the model's argmax, kept with the token before it as anchor.
    fn harvest_rejected(&mut self, fb: &Feedback<'_>) {
        let n = fb.flat.len();
        self.run.clear();
        self.run.resize(n, 0);
        let mut on_path = [false; 256];
        let mut on_path_big = Vec::new();
        let mark: &mut [bool] = if n <= 256 {
            &mut on_path[..n]
        } else {
            on_path_big.resize(n, false);
            &mut on_path_big
        };
        for &r in fb.path {
            mark[r] = true;
        }
        let mut best = 0usize;
        for r in 1..n {
            let p = fb.flat.parents[r];
            if p < 0 || mark[r] {
                continue;
            }
            let p = p as usize;
            if fb.flat.tokens[r] == fb.argmax[p] {
                self.run[r] = if mark[p] { 1 } else { self.run[p] + 1 };
                if self.run[r] > self.run[best] {
                    best = r;
                }
            }
        }
        let len = self.run[best] as usize;
        if len < self.cfg.ext_min_len {
            return;
        }
        let mut seg = vec![0u32; len];
        let mut r = best;
        for i in (0..len).rev() {
            seg[i] = fb.flat.tokens[r];
            r = fb.flat.parents[r] as usize;
        }
        let anchor = fb.flat.tokens[r];
        self.ext.keep(anchor, &seg, fb.step);
    }
}

impl Drafter for SamDrafter {
    fn prefill_topk(&self) -> usize {
        if self.cfg.calibration {
            4
        } else {
            0
        }
    }

    fn prefill_window(&self) -> usize {
        self.cfg.calib_window
    }

    fn begin(&mut self, prompt: &[u32], pre: &PrefillOut) {
        self.own.clear();
        self.own.extend(prompt);
        self.prompt_len = prompt.len();
        self.db_match = match &self.db {
            Some(db) => db.match_query(prompt),
            None => MatchState::default(),
        };
        if self.cfg.calibration {
            self.calib.build(prompt, pre);
            self.calib.follow_text = self.cfg.calib_follow_text;
        } else {
            self.calib.clear();
        }
        self.ext.clear();
    }

    fn draft(&mut self, ctx: &[u32], tree: &mut DraftTree, step: u64) {
        debug_assert_eq!(ctx.len(), self.own.len());
        let depth = tree.max_depth();
        // Own context: longest suffix with an earlier occurrence, then shorter ones.
        // Raw-text continuations go in first (the trie has a node cap), then the
        // database's, then the calibrated trees, which mostly refine them.
        let mut own = [(0usize, 0usize); 8];
        let mut n_own = 0;
        if self.own.self_match().is_some() {
            let m = self.own.match_state_of_self();
            self.own
                .link_chain(m, &mut self.chain, self.cfg.self_branches.min(own.len()));
            for &(len, end) in &self.chain {
                own[n_own] = (len, end);
                n_own += 1;
                let base = match_confidence(len);
                let ms = match_strength(len);
                let cont = self.own.continuation(end, depth);
                // Calibrated confidence: where the text lies in the calibrated prompt,
                // the node's feature also says how the model ranked the text token
                // there during prefill (the learned acceptance tells what that is worth).
                let calib = &self.calib;
                let cal = self.cfg.calib_confidence && self.cfg.calibration;
                tree.insert_feat(
                    0,
                    cont,
                    |d| base * 0.92f32.powi(d as i32),
                    |d| {
                        let pos = end + d;
                        if cal && calib.covers(pos) {
                            let s = calibrated_match_strength(len, calib.rank_of(pos, cont[d]));
                            feature(KIND_SELF_CAL, s, d)
                        } else {
                            feature(KIND_SELF, ms, d)
                        }
                    },
                    SRC_SELF,
                );
            }
        }
        // Other occurrences of the longest match: the first one is an arbitrary pick
        // among equally long matches, and the text may go on differently elsewhere.
        if self.cfg.occurrences > 0 && n_own > 0 {
            let (len, first) = own[0];
            let text = self.own.text();
            recent_occurrences(text, len, self.cfg.occurrences + 1, &mut self.found);
            let base = match_confidence(len);
            let ms = OTHER_OCCURRENCE + match_strength(len);
            for &end in self.found.iter().filter(|&&e| e != first) {
                if own[..n_own].iter().any(|&(_, e)| e == end) {
                    continue;
                }
                tree.insert_feat(
                    0,
                    self.own.continuation(end, depth),
                    |d| base * 0.92f32.powi(d as i32),
                    |d| feature(KIND_SELF, ms, d),
                    SRC_SELF,
                );
            }
        }
        // Database: longest suffix of the context found in past text.
        if let Some(db) = &self.db {
            db.link_chain(self.db_match, &mut self.chain, self.cfg.db_branches);
            for &(len, end) in &self.chain {
                let base = 0.8 * match_confidence(len);
                let ms = match_strength(len);
                tree.insert_feat(
                    0,
                    db.continuation(end, depth),
                    |d| base * 0.92f32.powi(d as i32),
                    |d| feature(KIND_DB, ms, d),
                    SRC_DB,
                );
            }
        }
        // Calibrated trees from the prompt positions of the own matches.
        if self.cfg.calibration && self.cfg.calib_trees {
            for &(len, end) in &own[..n_own] {
                if end >= self.calib.prompt_len() || !self.calib.covers(end) {
                    continue;
                }
                let cb = (match_confidence(len) * 1.1).min(0.95);
                self.calib
                    .chains(end, &self.cfg.calib_branch, depth, &mut |toks, probs| {
                        let mut acc = [0f32; 64];
                        let mut st = [0u8; 64];
                        let mut s = cb;
                        for (d, &p) in probs.iter().enumerate().take(64) {
                            s *= p * 0.97;
                            acc[d] = s;
                            st[d] = prob_strength(p) as u8;
                        }
                        tree.insert_feat(
                            0,
                            toks,
                            |d| acc[d.min(63)],
                            |d| feature(KIND_CALIB, st[d.min(63)] as usize, d),
                            SRC_CALIB,
                        );
                    });
            }
        }
        // Calibrated votes: after a short match the first occurrence's text is a weak
        // guess; rank every occurrence's model-preferred successors instead.
        if self.cfg.calibration && n_own > 0 && own[0].0 < self.cfg.calib_vote_below {
            let l = own[0].0.min(ctx.len());
            let mut v = [(0u32, 0f32, 0u32); 8];
            let n = self.calib.votes(
                &ctx[ctx.len() - l..],
                &mut v[..self.cfg.calib_vote_width.min(8)],
            );
            let mut seq = [0u32; 33];
            for &(tok, share, q) in &v[..n] {
                let rest = self.calib.text_after(tok, q as usize, depth.min(32) - 1);
                seq[0] = tok;
                seq[1..=rest.len()].copy_from_slice(rest);
                let st = 8 + prob_strength(share);
                let s0 = (share * 0.9).min(0.9);
                tree.insert_feat(
                    0,
                    &seq[..=rest.len()],
                    |d| s0 * 0.85f32.powi(d as i32),
                    |d| feature(KIND_CALIB, st, d),
                    SRC_CALIB,
                );
            }
        }
        // Reused rejected segments: resume a partly emitted one, start one at its
        // anchor, and hang them below draft nodes carrying their anchor.
        if self.cfg.extension {
            self.ext.expire(step);
            let root = *ctx.last().unwrap_or(&0);
            for seg in &self.ext.segments {
                let t = &seg.tokens;
                let progress = (1..t.len()).rev().find(|&m| ctx.ends_with(&t[..m]));
                if let Some(m) = progress {
                    tree.insert_feat(
                        0,
                        &t[m..],
                        |d| 0.5 * 0.9f32.powi(d as i32),
                        |d| feature(KIND_EXT, 0, d),
                        SRC_EXT,
                    );
                } else if root == seg.anchor {
                    tree.insert_feat(
                        0,
                        t,
                        |d| 0.4 * 0.9f32.powi(d as i32),
                        |d| feature(KIND_EXT, 1, d),
                        SRC_EXT,
                    );
                }
                tree.nodes_with_token(seg.anchor, &mut self.found);
                for &n in self.found.iter().take(4) {
                    let s0 = tree.node_score(n) * 0.5;
                    tree.insert_feat(
                        n,
                        t,
                        |d| s0 * 0.9f32.powi(d as i32),
                        |d| feature(KIND_EXT, 2, d),
                        SRC_EXT,
                    );
                }
            }
        }
    }

    fn observe(&mut self, emitted: &[u32], fb: Option<&Feedback<'_>>) {
        if self.cfg.extension {
            if let Some(fb) = fb {
                self.harvest_rejected(fb);
            }
        }
        // Append-only: only tokens that were actually emitted (pitfall 5).
        self.own.extend(emitted);
        if let Some(db) = &self.db {
            for &t in emitted {
                db.advance(&mut self.db_match, t);
            }
        }
    }
}

/// Strength offset of own-context candidates from another occurrence than the
/// automaton's first one (their acceptance is learned apart).
const OTHER_OCCURRENCE: usize = 8;

/// End indices of earlier occurrences of the last `len` tokens of `text` (not the
/// text's own end), most recent first, at most `max`.
fn recent_occurrences(text: &[u32], len: usize, max: usize, out: &mut Vec<usize>) {
    out.clear();
    let n = text.len();
    if len == 0 || len >= n {
        return;
    }
    let suffix = &text[n - len..];
    let last = suffix[len - 1];
    for e in (len - 1..n - 1).rev() {
        if out.len() >= max {
            break;
        }
        if text[e] == last && text[e + 1 - len..=e] == *suffix {
            out.push(e);
        }
    }
}

/// Build the drafter for a mode; `db` is the database automaton shared by runs.
pub fn make_drafter(mode: Mode, db: Option<Arc<SuffixAutomaton>>) -> Box<dyn Drafter + Send> {
    make_drafter_windowed(mode, db, usize::MAX)
}

/// [`make_drafter`] calibrating only the last `calib_window` prompt positions.
pub fn make_drafter_windowed(
    mode: Mode,
    db: Option<Arc<SuffixAutomaton>>,
    calib_window: usize,
) -> Box<dyn Drafter + Send> {
    match mode {
        Mode::None => Box::new(NoDrafter),
        Mode::Pld => Box::new(PldDrafter),
        _ => Box::new(SamDrafter::new(
            SamConfig {
                calib_window,
                ..SamConfig::for_mode(mode)
            },
            db,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::ARM_ALL;

    /// Depth of `future` in the trie `mode`'s drafter builds after `ctx`.
    fn recalled(cfg: SamConfig, ctx: &[u32], future: &[u32]) -> usize {
        let mut d = SamDrafter::new(cfg, None);
        d.begin(ctx, &PrefillOut::default());
        let mut t = DraftTree::new(256, 32);
        t.reset(*ctx.last().unwrap());
        d.draft(ctx, &mut t, 0);
        t.rank(None);
        let mut r = Vec::new();
        t.path_ranks(future, ARM_ALL, &mut r);
        r.len()
    }

    #[test]
    fn recent_occurrences_lists_every_earlier_match_most_recent_first() {
        let text = [1, 2, 3, 1, 2, 4, 0, 1, 2];
        let mut out = Vec::new();
        recent_occurrences(&text, 2, 8, &mut out);
        assert_eq!(out, vec![4, 1]);
        recent_occurrences(&text, 2, 1, &mut out);
        assert_eq!(out, vec![4]);
        recent_occurrences(&text, 3, 8, &mut out);
        assert!(out.is_empty(), "0 1 2 occurs only at the end");
        recent_occurrences(&text, 9, 8, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn later_occurrences_of_the_longest_match_are_drafted() {
        // "1 2" ends the context; its first occurrence goes on with 3, a later one
        // with 4 5 6 7, which is what follows. Only the first is the automaton's.
        let ctx = [1, 2, 3, 9, 9, 1, 2, 4, 5, 6, 7, 8, 1, 2];
        let future = [4, 5, 6, 7];
        let mut cfg = SamConfig::for_mode(Mode::Sam);
        cfg.occurrences = 0;
        assert_eq!(recalled(cfg.clone(), &ctx, &future), 0);
        cfg.occurrences = 2;
        assert_eq!(recalled(cfg, &ctx, &future), 4);
    }
}
