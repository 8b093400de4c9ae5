//! One `auto` round: the lookup sources' proposals and the gate's answer (the round's first
//! half, what batched drafting prepares), then the model's proposal and the merged tree.

use super::*;

/// A round's first half: the lookups' proposals and whether the model is asked, for
/// `committed.len()` tokens and `max_nodes`; its ms.
pub(super) struct Gathered {
    pub(super) len: usize,
    pub(super) max_nodes: usize,
    pub(super) props: Vec<Proposal>,
    pub(super) ask: bool,
    pub(super) ms: f64,
}

/// The trie's most likely continuations of `ctx` as a small tree: a few children at the root,
/// fewer below, each with its probability given its parent; and the length of the context
/// that matched at the root.
fn trie_tree(trie: &NgramTrie, ctx: &[TokenId], max_depth: usize) -> (usize, Vec<ContNode>) {
    let keep = trie.order().saturating_sub(1).max(1);
    let tail = &ctx[ctx.len().saturating_sub(keep)..];
    let (matched, first) = trie.continuations(tail, TRIE_WIDTH.0);
    let mut nodes: Vec<ContNode> = first
        .into_iter()
        .filter(|&(_, p)| p >= TRIE_MIN_P.0)
        .map(|(token, share)| ContNode {
            parent: None,
            token,
            share,
        })
        .collect();
    let mut depth = vec![1usize; nodes.len()];
    let mut i = 0;
    while i < nodes.len() && nodes.len() < TRIE_NODES {
        if depth[i] < max_depth.min(TRIE_DEPTH) {
            // The node's context: the committed tail, then the path down to it.
            let mut path = vec![nodes[i].token];
            let mut p = nodes[i].parent;
            while let Some(q) = p {
                path.push(nodes[q].token);
                p = nodes[q].parent;
            }
            path.reverse();
            let mut c: Vec<TokenId> = tail.to_vec();
            c.extend_from_slice(&path);
            let c = &c[c.len().saturating_sub(keep)..];
            for (token, share) in trie.continuations(c, TRIE_WIDTH.1).1 {
                if share >= TRIE_MIN_P.1 && nodes.len() < TRIE_NODES {
                    nodes.push(ContNode {
                        parent: Some(i),
                        token,
                        share,
                    });
                    depth.push(depth[i] + 1);
                }
            }
        }
        i += 1;
    }
    (matched, nodes)
}

/// A lookup's continuations as a proposal of `source`, classed by match length.
fn lookup(source: u8, c: Continuations) -> Option<Proposal> {
    (!c.nodes.is_empty()).then(|| Proposal {
        lead: false,
        source,
        class: length_class(c.longest),
        nodes: c.nodes,
    })
}

/// A model drafter's tree as a proposal: each node scored by its probability given its parent
/// (its path probability over its parent's; a chain without them, 0.5 each).
fn tree_proposal(source: u8, tree: &DraftTree, conf: Option<&[f32]>) -> Proposal {
    let nodes = (0..tree.len())
        .map(|i| {
            let n = crate::speculative::NodeId(i as u32);
            let parent = tree.parent(n);
            let share = match conf {
                Some(c) if c.len() == tree.len() => {
                    let above = parent.map_or(1.0, |p| c[p.idx()]);
                    if above > 0.0 {
                        (c[i] / above).clamp(0.0, 1.0)
                    } else {
                        0.0
                    }
                }
                _ => 0.5,
            };
            ContNode {
                parent: parent.map(|p| p.idx()),
                token: tree.token(n),
                share,
            }
        })
        .collect();
    Proposal {
        lead: true,
        source,
        class: 0,
        nodes,
    }
}

impl Auto<'_> {
    /// A round's first half: the new text indexed, the lookups' proposals, and whether the
    /// gate asks the model (a round that does not still shows it the text).
    pub(super) fn gather(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<Gathered> {
        let t = std::time::Instant::now();
        if committed.len() > self.text.len() {
            let new = &committed[self.text.len()..];
            if let Some(ix) = self.own.as_mut() {
                ix.extend(new);
            }
            self.text.extend_from_slice(new);
        }
        self.root = committed.last().copied();
        self.gate.round_starts(self.verified_last == 0);
        self.last = Merged::default();
        let mut g = Gathered {
            len: committed.len(),
            max_nodes,
            props: vec![],
            ask: false,
            ms: 0.0,
        };
        if max_nodes == 0 {
            self.keep_model_up(committed);
            return Ok(g);
        }
        g.props = self.proposals(committed, max_nodes)?;
        // The gate weighs the model against what the lookups alone expect, unless it runs the
        // model every round: then the lookups are merged once, with the model's proposal.
        g.ask = match &self.model {
            None => false,
            Some(_) if self.gate.every_round() => true,
            Some(_) => {
                self.last = self.merged(committed, &g.props, max_nodes)?;
                let expected: f64 = self.last.conf.iter().map(|&c| c as f64).sum();
                self.gate.run(expected)
            }
        };
        if !g.ask {
            self.keep_model_up(committed);
        }
        g.ms = t.elapsed().as_secs_f64() * 1e3;
        Ok(g)
    }

    /// A round's second half: the model's proposal when asked, and the merged tree.
    pub(super) fn finish(
        &mut self,
        committed: &[TokenId],
        max_nodes: usize,
        mut g: Gathered,
    ) -> Result<DraftTree> {
        (self.select_ms, self.model_ms, self.model_bit) = (0.0, 0.0, None);
        if max_nodes == 0 {
            return Ok(DraftTree::new());
        }
        let t = std::time::Instant::now();
        if g.ask && self.model.is_some() {
            match self.model_proposal(committed, max_nodes) {
                Ok(p) => g.props.push(p),
                // A source that fails is left out for the rest of the request; the
                // request goes on with the others.
                Err(e) => {
                    eprintln!("auto: model source left out of this request: {e}");
                    self.model = None;
                    self.model_bit = None;
                }
            }
        }
        // The lookups-only merge the gate read stands when the model was not asked; otherwise
        // (or with no model, or one that just failed) merge what was proposed.
        if g.ask || self.model.is_none() {
            self.last = self.merged(committed, &g.props, max_nodes)?;
        }
        // Selection: the lookups and the merge, and the model's own (not its forward).
        self.select_ms += g.ms + t.elapsed().as_secs_f64() * 1e3 - self.model_ms;
        Ok(self.last.tree.clone())
    }

    /// The proposals merged into one tree of at most `max_nodes` nodes (priced, when the
    /// request samples, by its tokens' noise at the root's position).
    fn merged(
        &self,
        committed: &[TokenId],
        props: &[Proposal],
        max_nodes: usize,
    ) -> Result<Merged> {
        let coupled = self.sampler.as_ref().map(|s| (s, committed.len() - 1));
        let calib = self.shared.calib.lock().map_err(|_| poisoned())?;
        merge(props, &calib, max_nodes, coupled)
    }

    /// The model source's proposal (at most [`MODEL_NODES`] nodes), timed.
    fn model_proposal(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<Proposal> {
        let s = self
            .kinds
            .iter()
            .position(|&k| k == Kind::Model)
            .unwrap_or(0) as u8;
        let m = self
            .model
            .as_mut()
            .ok_or_else(|| Error::BadRequest("auto: no model source".into()))?;
        let t = std::time::Instant::now();
        let tree = m.propose(committed, max_nodes.min(MODEL_NODES))?;
        // Its call's share of a batched pass counts as its own.
        self.model_ms = t.elapsed().as_secs_f64() * 1e3 + m.shared_ms();
        self.select_ms += m.selection_ms();
        self.model_bit = Some(1 << s);
        Ok(tree_proposal(s, &tree, m.node_confidence()))
    }

    /// A round that does not ask the model still shows it the text, as a proposal of no node
    /// (what a drafter that keeps pending states uses to keep them bounded).
    pub(super) fn keep_model_up(&mut self, committed: &[TokenId]) {
        if let Some(m) = self.model.as_mut() {
            if let Err(e) = m.propose(committed, 0) {
                eprintln!("auto: model source left out of this request: {e}");
                self.model = None;
            }
        }
    }

    /// The lookup sources' proposals for a tree of at most `max_nodes` nodes after `committed`.
    fn proposals(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<Vec<Proposal>> {
        let depth = max_nodes.min(MAX_DEPTH);
        let mut out = Vec::with_capacity(self.kinds.len());
        for (s, &kind) in self.kinds.iter().enumerate() {
            let s = s as u8;
            let p = match kind {
                Kind::Pld => self
                    .own
                    .as_ref()
                    .and_then(|ix| lookup(s, ix.continuations(committed, MAX_MATCHES, depth))),
                Kind::Suffix => match &self.shared.cache {
                    Some(c) => {
                        let ix = c.lock().map_err(|_| poisoned())?;
                        lookup(s, ix.continuations(committed, MAX_MATCHES, depth))
                    }
                    None => None,
                },
                Kind::Trie => self.trie.as_deref().and_then(|t| {
                    let (matched, nodes) = trie_tree(t, committed, depth);
                    (!nodes.is_empty()).then_some(Proposal {
                        lead: false,
                        source: s,
                        class: matched as u8,
                        nodes,
                    })
                }),
                Kind::Recycle => match (&self.shared.recycle, committed.last()) {
                    (Some(t), Some(&root)) => {
                        let nodes = t.lock().map_err(|_| poisoned())?.tree(root, depth);
                        (!nodes.is_empty()).then_some(Proposal {
                            lead: false,
                            source: s,
                            class: 0,
                            nodes,
                        })
                    }
                    _ => None,
                },
                Kind::Model => None, // asked by `propose` when the gate says so
            };
            out.extend(p);
        }
        Ok(out)
    }
}

pub(super) fn poisoned() -> Error {
    Error::BadRequest("auto: a shared table was poisoned by a failed request".into())
}
