//! Token trees: candidates from every draft source merged into one trie per step,
//! ranked by score, cut at the node budget and flattened in BFS order for one
//! verification forward.
//!
//! Node 0 is always the pending token (the last emitted token, not yet in the KV
//! cache), so a verify batch is `[pending, d1..dk]` (pitfall 3) and even a tree
//! with no drafts is a plain decode step.

/// Source tags, kept per node for statistics.
pub const SRC_SELF: u8 = 1;
pub const SRC_DB: u8 = 2;
pub const SRC_CALIB: u8 = 4;
pub const SRC_EXT: u8 = 8;
pub const SRC_PLD: u8 = 16;

/// A ranked trie is cut two ways ("arms"): over every source, or over the raw-text
/// sources only (own-context and database automata, prompt lookup: sam's own tree).
/// Both are evaluated counterfactually every step, so the generator can verify
/// whichever pays more and sdnpu never loses to its sam part where calibration or
/// extension do not help.
pub const ARMS: usize = 2;
pub const ARM_ALL: usize = 0;
pub const ARM_BASE: usize = 1;
/// Sources the base arm keeps.
pub const BASE_SOURCES: u8 = SRC_SELF | SRC_DB | SRC_PLD;

use crate::accept_model::{
    feature, node_key, AcceptModel, KIND_CALIB, KIND_DB, KIND_EXT, KIND_OTHER, KIND_PLD, KIND_SELF,
};

/// Features kept per node (distinct sources that proposed it).
const FEATS: usize = 3;

/// Generic feature of a source tag (strength 0), for inserts without their own.
pub fn source_feature(source: u8, step: usize) -> u16 {
    let kind = match source {
        SRC_SELF => KIND_SELF,
        SRC_DB => KIND_DB,
        SRC_CALIB => KIND_CALIB,
        SRC_EXT => KIND_EXT,
        SRC_PLD => KIND_PLD,
        _ => KIND_OTHER,
    };
    feature(kind, 0, step)
}

#[derive(Clone, Copy, Debug)]
struct Node {
    token: u32,
    parent: i32,
    depth: u32,
    score: f32,
    first_child: i32,
    next_sibling: i32,
    sources: u8,
    /// (feature, drafter's conditional prior) of each source that proposed it.
    feats: [(u16, f32); FEATS],
    nfeat: u8,
    /// Estimated probability that the node is accepted (after `rank`).
    est: f32,
}

impl Node {
    /// Learned key and prior: the strongest proposal, and whether it was confirmed.
    fn key(&self) -> (u16, f32) {
        let n = self.nfeat as usize;
        let best = self.feats[..n]
            .iter()
            .copied()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((0, 0.0));
        (node_key(best.0, n >= 2), best.1)
    }

    fn add_feat(&mut self, f: u16, prior: f32) {
        let n = self.nfeat as usize;
        if let Some(e) = self.feats[..n].iter_mut().find(|e| e.0 == f) {
            e.1 = e.1.max(prior);
        } else if n < FEATS {
            self.feats[n] = (f, prior);
            self.nfeat += 1;
        } else if let Some(e) = self.feats.iter_mut().min_by(|a, b| a.1.total_cmp(&b.1)) {
            if prior > e.1 {
                *e = (f, prior);
            }
        }
    }
}

/// Trie of draft candidates rooted at the pending token.
#[derive(Clone, Debug)]
pub struct DraftTree {
    nodes: Vec<Node>,
    max_nodes: usize,
    max_depth: usize,
    /// Per arm: node ids sorted by rank (valid after `rank`).
    order: [Vec<u32>; ARMS],
    /// Per arm: rank of every node id (`u32::MAX` when the arm excludes it).
    rank_of: [Vec<u32>; ARMS],
}

/// A flattened, budget-cut tree ready for verification.
#[derive(Clone, Debug, Default)]
pub struct FlatTree {
    /// Token of each batch row; row 0 is the pending token.
    pub tokens: Vec<u32>,
    /// Parent row of each row; -1 for row 0 (child of the last committed token).
    pub parents: Vec<i32>,
    /// Depth of each row = position offset from the first uncommitted slot.
    pub depths: Vec<u32>,
    /// Trie node id of each row.
    pub node_ids: Vec<u32>,
    pub sources: Vec<u8>,
}

impl FlatTree {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// True when row `a` is `b` or one of its ancestors: the attention mask
    /// (row b attends to the committed KV plus every such row a).
    pub fn sees(&self, b: usize, a: usize) -> bool {
        let mut cur = b as i32;
        while cur >= 0 {
            if cur as usize == a {
                return true;
            }
            cur = self.parents[cur as usize];
        }
        false
    }

    /// Dense row-major ancestor mask, for backends that take one.
    pub fn ancestor_mask(&self) -> Vec<bool> {
        let n = self.len();
        let mut m = vec![false; n * n];
        for b in 0..n {
            for a in 0..n {
                m[b * n + a] = self.sees(b, a);
            }
        }
        m
    }

    /// Greedy acceptance: follow the argmax chain from row 0 while a child carries
    /// the predicted token. Fills `path` with the accepted rows (row 0 first) and
    /// returns the bonus token (argmax after the last accepted row).
    pub fn accept(&self, argmax: &[u32], path: &mut Vec<usize>) -> u32 {
        self.accept_by(|row, _| argmax[row], path)
    }

    /// [`FlatTree::accept`] with the target's choice computed on demand along the
    /// path: `choose(row, depth)` is the token the target picks after `row`, which
    /// sits `depth` rows below the root (sampling needs only the path's rows).
    pub fn accept_by(
        &self,
        mut choose: impl FnMut(usize, usize) -> u32,
        path: &mut Vec<usize>,
    ) -> u32 {
        path.clear();
        path.push(0);
        let mut cur = 0usize;
        loop {
            let want = choose(cur, path.len() - 1);
            // Children have larger row indices than their parent (BFS order).
            let child = (cur + 1..self.len())
                .find(|&r| self.parents[r] == cur as i32 && self.tokens[r] == want);
            match child {
                Some(c) => {
                    path.push(c);
                    cur = c;
                }
                None => return want,
            }
        }
    }
}

impl DraftTree {
    pub fn new(max_nodes: usize, max_depth: usize) -> Self {
        DraftTree {
            nodes: Vec::with_capacity(max_nodes),
            max_nodes: max_nodes.max(1),
            max_depth,
            order: std::array::from_fn(|_| Vec::with_capacity(max_nodes)),
            rank_of: std::array::from_fn(|_| Vec::with_capacity(max_nodes)),
        }
    }

    /// Start a new step with `pending` as the root.
    pub fn reset(&mut self, pending: u32) {
        self.nodes.clear();
        for a in 0..ARMS {
            self.order[a].clear();
            self.rank_of[a].clear();
        }
        self.nodes.push(Node {
            token: pending,
            parent: -1,
            depth: 0,
            score: f32::INFINITY,
            first_child: -1,
            next_sibling: -1,
            sources: 0,
            feats: [(0, 1.0); FEATS],
            nfeat: 0,
            est: 1.0,
        });
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn root_token(&self) -> u32 {
        self.nodes[0].token
    }

    fn child(&self, n: usize, tok: u32) -> Option<usize> {
        let mut c = self.nodes[n].first_child;
        while c >= 0 {
            if self.nodes[c as usize].token == tok {
                return Some(c as usize);
            }
            c = self.nodes[c as usize].next_sibling;
        }
        None
    }

    /// Insert a candidate continuation of the root. `score(d)` is the estimated
    /// probability that the candidate's first d+1 tokens are all accepted; scores are
    /// clamped to be non-increasing along a path so that every cut by rank is a
    /// connected subtree. Returns the number of new nodes.
    pub fn insert(&mut self, seq: &[u32], score: impl Fn(usize) -> f32, source: u8) -> usize {
        self.insert_feat(0, seq, score, |d| source_feature(source, d), source)
    }

    /// Insert below an existing path of the trie given by tokens (after the root);
    /// nothing is inserted when that path is absent.
    pub fn insert_after(
        &mut self,
        prefix: &[u32],
        seq: &[u32],
        score: impl Fn(usize) -> f32,
        source: u8,
    ) -> usize {
        let mut n = 0usize;
        for &t in prefix {
            match self.child(n, t) {
                Some(c) => n = c,
                None => return 0,
            }
        }
        self.insert_below(n, seq, score, source)
    }

    /// Insert `seq` as a continuation of trie node `start`.
    pub fn insert_below(
        &mut self,
        start: usize,
        seq: &[u32],
        score: impl Fn(usize) -> f32,
        source: u8,
    ) -> usize {
        self.insert_feat(start, seq, score, |d| source_feature(source, d), source)
    }

    /// Insert `seq` below node `start`, token i with prior path score `score(i)`
    /// (relative to the whole path from the root) and feature `feat(i)` for the
    /// learned acceptance model.
    pub fn insert_feat(
        &mut self,
        start: usize,
        seq: &[u32],
        score: impl Fn(usize) -> f32,
        feat: impl Fn(usize) -> u16,
        source: u8,
    ) -> usize {
        let mut n = start;
        let mut added = 0;
        let mut prev = if start == 0 {
            1.0
        } else {
            self.nodes[start].score
        };
        for (i, &t) in seq.iter().enumerate() {
            if t == crate::sam::SEPARATOR || self.nodes[n].depth as usize >= self.max_depth {
                break;
            }
            let raw = score(i);
            // The drafter's conditional guess: P(this token | the previous ones).
            let cond = if prev > 0.0 {
                (raw / prev).clamp(0.0, 1.0)
            } else {
                0.0
            };
            prev = raw;
            let s = raw.min(self.nodes[n].score);
            let f = feat(i);
            match self.child(n, t) {
                Some(c) => {
                    let node = &mut self.nodes[c];
                    node.score = node.score.max(s);
                    node.sources |= source;
                    node.add_feat(f, cond);
                    n = c;
                }
                None => {
                    if self.nodes.len() >= self.max_nodes {
                        break;
                    }
                    let id = self.nodes.len();
                    let parent = &self.nodes[n];
                    let mut node = Node {
                        token: t,
                        parent: n as i32,
                        depth: parent.depth + 1,
                        score: s,
                        first_child: -1,
                        next_sibling: parent.first_child,
                        sources: source,
                        feats: [(0, 0.0); FEATS],
                        nfeat: 0,
                        est: 0.0,
                    };
                    node.add_feat(f, cond);
                    self.nodes.push(node);
                    self.nodes[n].first_child = id as i32;
                    n = id;
                    added += 1;
                }
            }
        }
        added
    }

    /// Rank nodes by estimated acceptance probability (ties: shallower first, then
    /// older): the product along the path of each node's conditional acceptance,
    /// learned per feature by `model` (the drafters' priors when None). Conditionals
    /// are at most 1, so estimates never increase along a path and every prefix of
    /// the ranking is a connected subtree.
    pub fn rank(&mut self, model: Option<&AcceptModel>) {
        // Parents precede children in id order.
        self.nodes[0].est = 1.0;
        for i in 1..self.nodes.len() {
            let p = self.nodes[i].parent as usize;
            if self.nodes[i].score > self.nodes[p].score {
                self.nodes[i].score = self.nodes[p].score;
            }
            let (key, prior) = self.nodes[i].key();
            let cond = match model {
                Some(m) => m.p(key, prior),
                None => prior,
            };
            self.nodes[i].est = self.nodes[p].est * cond;
        }
        let nodes = &self.nodes;
        let [all, base] = &mut self.order;
        all.clear();
        all.extend(0..nodes.len() as u32);
        all.sort_by(|&a, &b| {
            let (na, nb) = (&nodes[a as usize], &nodes[b as usize]);
            nb.est
                .total_cmp(&na.est)
                .then(na.depth.cmp(&nb.depth))
                .then(a.cmp(&b))
        });
        // A base-source node's ancestors carry its sources too (a candidate marks
        // its whole path), so the base arm's every prefix is connected as well.
        base.clear();
        base.extend(
            all.iter()
                .copied()
                .filter(|&id| id == 0 || nodes[id as usize].sources & BASE_SOURCES != 0),
        );
        for a in 0..ARMS {
            self.rank_of[a].clear();
            self.rank_of[a].resize(self.nodes.len(), u32::MAX);
            for (r, &id) in self.order[a].iter().enumerate() {
                self.rank_of[a][id as usize] = r as u32;
            }
        }
    }

    /// Nodes (root included) the arm can verify.
    pub fn arm_len(&self, arm: usize) -> usize {
        self.order[arm].len()
    }

    /// Expected accepted draft tokens if the best `budget` rows were verified: the
    /// sum of the estimated acceptance of the arm's ranked nodes after the root.
    pub fn expected_accepted(&self, budget: usize, arm: usize) -> f32 {
        let order = &self.order[arm];
        let n = budget.min(order.len());
        order[1.min(n)..n]
            .iter()
            .map(|&id| self.nodes[id as usize].est)
            .sum()
    }

    /// Teach `model` from this trie once the true continuation `future` (tokens
    /// after the root) is known: every child of a node on the true path is a trial,
    /// a hit when it carries the next true token. Stops where `future` ends.
    pub fn learn(&self, future: &[u32], model: &mut AcceptModel) {
        let mut n = 0usize;
        for &t in future {
            let mut next = None;
            let mut c = self.nodes[n].first_child;
            while c >= 0 {
                let node = &self.nodes[c as usize];
                let hit = node.token == t;
                model.observe(node.key().0, hit);
                if hit {
                    next = Some(c as usize);
                }
                c = node.next_sibling;
            }
            match next {
                Some(c) => n = c,
                None => return,
            }
        }
    }

    /// Estimated acceptance of the node with rank r (after `rank`, every source).
    pub fn score_at_rank(&self, r: usize) -> f32 {
        self.nodes[self.order[ARM_ALL][r] as usize].est
    }

    /// Cut the ranked tree at `budget` rows of every source and flatten it in BFS order.
    pub fn flatten(&self, budget: usize, out: &mut FlatTree) {
        self.flatten_arm(budget, ARM_ALL, out)
    }

    /// Cut the arm's ranking at `budget` rows and flatten it in BFS order.
    pub fn flatten_arm(&self, budget: usize, arm: usize, out: &mut FlatTree) {
        let order = &self.order[arm];
        let n = budget.clamp(1, order.len());
        out.tokens.clear();
        out.parents.clear();
        out.depths.clear();
        out.node_ids.clear();
        out.sources.clear();
        out.node_ids.extend_from_slice(&order[..n]);
        let nodes = &self.nodes;
        let rank_of = &self.rank_of[arm];
        out.node_ids
            .sort_by_key(|&id| (nodes[id as usize].depth, rank_of[id as usize]));
        for i in 0..n {
            let node = &self.nodes[out.node_ids[i] as usize];
            let parent = if node.parent < 0 {
                -1
            } else {
                // Parents have smaller depth, hence an earlier row.
                out.node_ids[..i]
                    .iter()
                    .position(|&id| id as i32 == node.parent)
                    .map(|p| p as i32)
                    .unwrap_or(-1)
            };
            out.tokens.push(node.token);
            out.parents.push(parent);
            out.depths.push(node.depth);
            out.sources.push(node.sources);
        }
    }

    /// Counterfactual evaluation once the true continuation is known: ranks of the
    /// trie nodes along the path that `future` (the tokens after the root) follows.
    /// With budget b, the step would have accepted the number of these ranks < b.
    /// Returns whether the walk ended inside the known future (a mismatch or a leaf),
    /// i.e. the result can no longer change as more output arrives. Ranks are the
    /// arm's; the walk stops at the first node the arm excludes.
    pub fn path_ranks(&self, future: &[u32], arm: usize, ranks: &mut Vec<u32>) -> bool {
        ranks.clear();
        let mut n = 0usize;
        for &t in future {
            match self.child(n, t) {
                Some(c) => {
                    let r = self.rank_of[arm][c];
                    if r == u32::MAX {
                        return true;
                    }
                    ranks.push(r);
                    n = c;
                }
                None => return true,
            }
        }
        self.nodes[n].first_child < 0
    }

    /// Node ids (excluding the root) carrying `tok`.
    pub fn nodes_with_token(&self, tok: u32, out: &mut Vec<usize>) {
        out.clear();
        out.extend((1..self.nodes.len()).filter(|&i| self.nodes[i].token == tok));
    }

    pub fn node_score(&self, id: usize) -> f32 {
        self.nodes[id].score
    }

    pub fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// Source tags along the accepted trie path, for statistics.
    pub fn sources_of(&self, id: usize) -> u8 {
        self.nodes[id].sources
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat_of(t: &DraftTree, b: usize) -> FlatTree {
        let mut f = FlatTree::default();
        t.flatten(b, &mut f);
        f
    }

    #[test]
    fn merge_dedupes_common_prefixes() {
        let mut t = DraftTree::new(64, 16);
        t.reset(7);
        assert_eq!(t.insert(&[1, 2, 3], |_| 0.9, SRC_SELF), 3);
        assert_eq!(t.insert(&[1, 2, 4], |_| 0.5, SRC_DB), 1);
        assert_eq!(t.insert(&[1, 2, 3], |_| 0.1, SRC_CALIB), 0);
        assert_eq!(t.len(), 5);
        t.rank(None);
        let f = flat_of(&t, 64);
        assert_eq!(f.tokens, vec![7, 1, 2, 3, 4]);
        assert_eq!(f.parents, vec![-1, 0, 1, 2, 2]);
        assert_eq!(f.depths, vec![0, 1, 2, 3, 3]);
    }

    #[test]
    fn budget_cut_is_connected_and_bfs() {
        let mut t = DraftTree::new(64, 16);
        t.reset(0);
        t.insert(&[1, 2, 3, 4], |d| 0.9f32.powi(d as i32 + 1), SRC_SELF);
        t.insert(&[5, 6], |d| 0.8f32.powi(d as i32 + 1), SRC_DB);
        t.insert(&[1, 9], |_| 0.95, SRC_CALIB); // scores clamp below parent 1
        t.rank(None);
        for b in 1..=t.len() {
            let f = flat_of(&t, b);
            assert_eq!(f.len(), b);
            assert_eq!(f.parents[0], -1);
            for i in 1..f.len() {
                assert!(f.parents[i] >= 0 && (f.parents[i] as usize) < i);
                assert_eq!(f.depths[i], f.depths[f.parents[i] as usize] + 1);
                if i > 1 {
                    assert!(f.depths[i] >= f.depths[i - 1]);
                }
            }
        }
        // Best-first: with 3 rows we get root, "1" and its best child "9" (0.95
        // clamped to its parent's 0.9, above "2" at 0.81).
        let f = flat_of(&t, 3);
        assert_eq!(f.tokens, vec![0, 1, 9]);
        let f = flat_of(&t, 4);
        assert_eq!(f.tokens, vec![0, 1, 9, 2]);
        // "5" (0.8) comes next and sorts into depth 1 of the BFS order.
        let f = flat_of(&t, 5);
        assert_eq!(f.tokens, vec![0, 1, 5, 9, 2]);
        assert_eq!(f.parents, vec![-1, 0, 0, 1, 1]);
    }

    #[test]
    fn ancestor_mask_matches_parents() {
        let mut t = DraftTree::new(64, 16);
        t.reset(0);
        t.insert(&[1, 2], |_| 0.9, SRC_SELF);
        t.insert(&[3], |_| 0.5, SRC_SELF);
        t.rank(None);
        let f = flat_of(&t, 4);
        // rows: 0, 1, 3, 2  (BFS)
        assert_eq!(f.tokens, vec![0, 1, 3, 2]);
        let m = f.ancestor_mask();
        let n = 4;
        let expect = [
            [true, false, false, false],
            [true, true, false, false],
            [true, false, true, false],
            [true, true, false, true],
        ];
        for b in 0..n {
            for a in 0..n {
                assert_eq!(m[b * n + a], expect[b][a], "row {b} col {a}");
            }
        }
    }

    #[test]
    fn accept_follows_argmax_chain_and_emits_bonus() {
        let mut t = DraftTree::new(64, 16);
        t.reset(10);
        t.insert(&[11, 12, 13], |_| 0.9, SRC_SELF);
        t.insert(&[11, 20], |_| 0.5, SRC_SELF);
        t.rank(None);
        let f = flat_of(&t, 5);
        assert_eq!(f.tokens, vec![10, 11, 12, 20, 13]);
        let mut path = Vec::new();
        // model: after 10 -> 11, after 11 -> 20, after 20 -> 99
        let argmax = vec![11, 20, 13, 99, 0];
        let bonus = f.accept(&argmax, &mut path);
        assert_eq!(path, vec![0, 1, 3]);
        assert_eq!(bonus, 99);
        // Nothing accepted: only the bonus.
        let argmax = vec![42, 0, 0, 0, 0];
        assert_eq!(f.accept(&argmax, &mut path), 42);
        assert_eq!(path, vec![0]);
    }

    #[test]
    fn path_ranks_counterfactual() {
        let mut t = DraftTree::new(64, 16);
        t.reset(0);
        t.insert(&[1, 2, 3], |d| 0.9f32.powi(d as i32 + 1), SRC_SELF);
        t.insert(&[4], |_| 0.95, SRC_DB);
        t.rank(None);
        let mut r = Vec::new();
        assert!(t.path_ranks(&[1, 2, 7], ARM_ALL, &mut r));
        assert_eq!(r.len(), 2);
        assert!(r[0] < r[1]);
        // Future too short to decide: walk ended at an inner node.
        assert!(!t.path_ranks(&[1], ARM_ALL, &mut r));
        assert!(t.path_ranks(&[1, 2, 3, 5], ARM_ALL, &mut r)); // reached a leaf
        assert_eq!(r.len(), 3);
    }

    #[test]
    fn max_nodes_and_depth_are_caps() {
        let mut t = DraftTree::new(4, 2);
        t.reset(0);
        t.insert(&[1, 2, 3, 4], |_| 0.9, SRC_SELF);
        assert_eq!(t.len(), 3); // depth cap 2
        t.insert(&[5, 6, 7], |_| 0.9, SRC_SELF);
        assert_eq!(t.len(), 4); // node cap
    }

    #[test]
    fn learn_counts_children_of_the_true_path() {
        use crate::accept_model::{feature, node_key, KIND_DB, KIND_SELF};
        let fa = |d| feature(KIND_SELF, 1, d);
        let fb = |d| feature(KIND_DB, 1, d);
        let ka = |d| node_key(fa(d), false);
        let kb = |d| node_key(fb(d), false);
        let mut t = DraftTree::new(64, 16);
        t.reset(0);
        t.insert_feat(0, &[1, 2, 3], |_| 0.9, fa, SRC_SELF);
        t.insert_feat(0, &[1, 4], |_| 0.5, fb, SRC_DB);
        t.insert_feat(0, &[5], |_| 0.5, fb, SRC_DB);
        let mut m = AcceptModel::default();
        t.learn(&[1, 2, 9, 9], &mut m);
        // Root's children: 1 (proposed by both: the agreed key of its strongest
        // feature, hit) and 5 (miss); 1's children: 2 (hit) and 4 (miss); 2's child 3
        // (miss); then the walk ends.
        assert!((m.trials(node_key(fa(0), true)) - 1.0).abs() < 1e-6);
        assert_eq!(m.trials(ka(0)), 0.0);
        assert!((m.trials(kb(0)) - 1.0).abs() < 1e-6);
        assert!((m.trials(ka(1)) - 1.0).abs() < 1e-6);
        assert!((m.trials(kb(1)) - 1.0).abs() < 1e-6);
        assert!((m.trials(ka(2)) - 1.0).abs() < 1e-6);
        assert!(m.p(ka(1), 0.5) > 0.5 && m.p(kb(1), 0.5) < 0.5);
        // A future that stops early records only what is known.
        let mut m2 = AcceptModel::default();
        t.learn(&[1], &mut m2);
        assert_eq!(m2.trials(ka(1)), 0.0);
    }

    #[test]
    fn learned_acceptance_reorders_and_estimates() {
        use crate::accept_model::{feature, KIND_DB, KIND_SELF};
        let fa = |d| feature(KIND_SELF, 2, d);
        let fb = |d| feature(KIND_DB, 2, d);
        let build = |t: &mut DraftTree| {
            t.reset(0);
            t.insert_feat(0, &[1, 2], |d| 0.8f32.powi(d as i32 + 1), fa, SRC_SELF);
            t.insert_feat(0, &[3, 4], |d| 0.4f32.powi(d as i32 + 1), fb, SRC_DB);
        };
        let mut t = DraftTree::new(64, 16);
        build(&mut t);
        t.rank(None);
        assert_eq!(flat_of(&t, 2).tokens, vec![0, 1]);
        assert!((t.expected_accepted(3, ARM_ALL) - (0.8 + 0.64)).abs() < 1e-5);
        // The database source turns out to be always right, self never.
        let mut m = AcceptModel::default();
        for _ in 0..200 {
            t.learn(&[3, 4, 7], &mut m);
        }
        t.rank(Some(&m));
        assert_eq!(flat_of(&t, 3).tokens, vec![0, 3, 4]);
        assert!(t.expected_accepted(3, ARM_ALL) > 1.8);
        for b in 1..=t.len() {
            let f = flat_of(&t, b);
            for i in 1..f.len() {
                assert!(f.parents[i] >= 0 && (f.parents[i] as usize) < i);
            }
        }
    }

    #[test]
    fn base_arm_drops_calibration_and_extension_nodes() {
        let mut t = DraftTree::new(64, 16);
        t.reset(0);
        t.insert(&[1, 2, 3], |d| 0.8f32.powi(d as i32 + 1), SRC_SELF);
        // Calibration refines the same text (shared prefix) and adds branches.
        t.insert(&[1, 9, 9], |_| 0.95, SRC_CALIB);
        t.insert(&[5], |_| 0.99, SRC_EXT);
        t.insert(&[6, 7], |_| 0.3, SRC_DB);
        t.rank(None);
        assert_eq!(t.arm_len(ARM_ALL), t.len());
        assert_eq!(t.arm_len(ARM_BASE), 6); // root, 1, 2, 3, 6, 7
        let mut f = FlatTree::default();
        t.flatten_arm(64, ARM_BASE, &mut f);
        assert!(f.sources[1..].iter().all(|&s| s & BASE_SOURCES != 0));
        for b in 1..=t.arm_len(ARM_BASE) {
            t.flatten_arm(b, ARM_BASE, &mut f);
            assert_eq!(f.len(), b);
            for i in 1..f.len() {
                assert!(f.parents[i] >= 0 && (f.parents[i] as usize) < i);
            }
        }
        // The full arm puts the extension branch first; the base arm never has it.
        t.flatten_arm(2, ARM_ALL, &mut f);
        assert_eq!(f.tokens, vec![0, 5]);
        t.flatten_arm(2, ARM_BASE, &mut f);
        assert_eq!(f.tokens, vec![0, 1]);
        // Counterfactual walk: the base arm stops where only calibration went.
        let mut r = Vec::new();
        assert!(t.path_ranks(&[1, 9, 9], ARM_BASE, &mut r));
        assert_eq!(r.len(), 1);
        t.path_ranks(&[1, 9, 9], ARM_ALL, &mut r);
        assert_eq!(r.len(), 3);
        assert!(t.expected_accepted(64, ARM_BASE) < t.expected_accepted(64, ARM_ALL));
    }
}
