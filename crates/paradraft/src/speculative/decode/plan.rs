//! A session's part of a step, planned: a prompt chunk, or a round in two phases
//! ([`Session::prepare`] sizes it and prepares the drafter, [`Session::propose`] drafts, cuts
//! and linearises it once the step has run the drafters' shared passes), and what its rows
//! need from the forward.

use super::*;

/// What [`Session::prepare`] planned.
pub enum Prepared {
    /// Nothing: the session is over (stopped, or its cache is full).
    Over,
    /// Its rows: a prompt chunk.
    Planned,
    /// A round, for [`Session::propose`] to draft once the step has run the pass its drafter
    /// queued its call in (when it did).
    Drafting(Option<SharedPass>),
}

/// A round sized by [`Session::prepare`]: its facts, node budget, root slot and the ms the
/// drafter's preparation took.
pub(super) struct Drafting {
    pub(super) facts: RoundFacts,
    pub(super) budget: usize,
    pub(super) base: usize,
    pub(super) ms: f64,
}

/// A forward in flight: a prompt chunk, or a drafted and linearised round. (One per session,
/// never moved in bulk: the variants' size difference does not matter.)
#[allow(clippy::large_enum_variant)]
pub(super) enum Pending {
    Prefill {
        n: usize,
        positions: Vec<Pos>,
    },
    /// A chunk of committed tokens whose K/V a preemption dropped, from `from`.
    Rebuild {
        from: usize,
        n: usize,
        positions: Vec<Pos>,
    },
    Round(Planned),
}

/// A drafted, sized and linearised round waiting for its forward.
pub(super) struct Planned {
    pub(super) tree: DraftTree,
    /// How `tree` grafted the drafter's proposal under forced tokens, when it did.
    pub(super) grafted: Option<crate::speculative::forced::Grafted>,
    pub(super) lin: Linearised,
    pub(super) facts: RoundFacts,
    /// Σ path probability of the nodes kept (trees cut by sizing).
    pub(super) predicted: f64,
    pub(super) stats: RoundStats,
    pub(super) verify_start: Instant,
}

impl Session<'_> {
    /// Plans the session's part of the next forward: the next chunk of at most
    /// `prefill_budget` prompt tokens while prefilling, else a round drafted for its share of
    /// a forward shaped like `batch` (sized by the sizer, cut to the cache's room), linearised
    /// as [root, nodes]. `false` when the session is over (stopped or its cache is full).
    /// [`Session::prepare`] then [`Session::propose`], the drafter running its own pass.
    pub fn plan(&mut self, kv: &KvCache, batch: BatchShape, prefill_budget: usize) -> Result<bool> {
        Ok(match self.prepare(kv, batch, prefill_budget)? {
            Prepared::Over => false,
            Prepared::Planned => true,
            Prepared::Drafting(_) => {
                self.propose()?;
                true
            }
        })
    }

    /// [`Session::plan`]'s first phase, what a batched step asks of every session before it
    /// runs the drafters' shared passes: a prompt chunk is planned; a round is sized and its
    /// drafter prepared ([`Drafter::prepare`]), for [`Session::propose`] to finish.
    pub fn prepare(
        &mut self,
        kv: &KvCache,
        batch: BatchShape,
        prefill_budget: usize,
    ) -> Result<Prepared> {
        if self.stop.is_some() {
            return Ok(Prepared::Over);
        }
        if self.prefilling() {
            self.plan_prefill(prefill_budget);
            return Ok(Prepared::Planned);
        }
        let base = kv.len(); // the root's slot and position
        if kv.capacity() <= base {
            self.stop = Some(StopReason::ContextFull);
            return Ok(Prepared::Over);
        }
        let facts = RoundFacts {
            max: self.max_draft,
            room: kv.capacity() - (base + 1),
            batch,
            trees: self.drafter.node_confidence().is_some(),
        };
        let budget = self.sizing.before(&facts).min(self.max_draft);
        self.drafter.batch(self.sizing.price(&facts));
        let t = Instant::now();
        let pass = self.drafter.prepare(&self.committed, budget)?;
        self.drafting = Some(Drafting {
            facts,
            budget,
            base,
            ms: t.elapsed().as_secs_f64() * 1e3,
        });
        Ok(Prepared::Drafting(pass))
    }

    /// [`Session::plan`]'s second phase for a round [`Session::prepare`] sized: the drafter's
    /// proposal, cut to what pays, grafted under a grammar's forced tokens and linearised.
    pub fn propose(&mut self) -> Result<()> {
        let Drafting {
            facts,
            budget,
            base,
            ms,
        } = self
            .drafting
            .take()
            .ok_or_else(|| Error::BadRequest("a round proposed before it was prepared".into()))?;
        let mut stats = RoundStats::default();
        let t = Instant::now();
        let mut tree = self.drafter.propose(&self.committed, budget)?;
        // Drafting: both phases, and the round's share of a batched pass.
        stats.draft_ms = ms + t.elapsed().as_secs_f64() * 1e3 + self.drafter.shared_ms();
        // A round that drafted nothing selected nothing (the drafter's figure is its last draft's).
        stats.select_ms = if tree.is_empty() {
            0.0
        } else {
            self.drafter.selection_ms()
        };
        stats.proposed = tree.len();
        let conf = self.drafter.node_confidence();
        let cut = self
            .sizing
            .cut(&mut tree, conf, stats.draft_ms, budget, &facts);
        stats.undrafted = cut.undrafted;
        stats.predicted = cut.predicted;
        if let Some(c) = conf {
            stats.conf = c[..tree.len().min(c.len())].to_vec();
        }
        // With a grammar (when speculating): its forced tokens first, a chain the drafter's
        // tree is grafted under, the nodes it forbids cut.
        let (tree, grafted) = match &mut self.process {
            Some(p) if self.max_draft > 0 && p.constrained() => {
                let forced = p.forced();
                let room = facts.room.min(self.max_draft.max(tree.len()));
                let (v, g) = crate::speculative::forced::graft(&forced, tree, room, &mut |path| {
                    p.allows(path)
                })?;
                (v, Some(g))
            }
            _ => (tree, None),
        };
        let t = Instant::now();
        let lin = tree.linearise(self.root, base);
        stats.tree_ms = t.elapsed().as_secs_f64() * 1e3;
        self.pending = Some(Pending::Round(Planned {
            tree,
            grafted,
            lin,
            facts,
            predicted: cut.predicted,
            stats,
            verify_start: Instant::now(),
        }));
        Ok(())
    }

    /// The next chunk of at most `budget` prompt (or rebuilt) tokens.
    fn plan_prefill(&mut self, budget: usize) {
        let n = self.prompt_left().min(budget.max(1));
        let from = self.rebuild.map_or(self.prefilled, |r| r.0);
        let positions = (from as u32..(from + n) as u32).map(Pos).collect();
        self.pending = Some(match self.rebuild {
            Some(_) => Pending::Rebuild { from, n, positions },
            None => {
                self.prefill_start.get_or_insert_with(Instant::now);
                Pending::Prefill { n, positions }
            }
        });
    }

    /// The planned rows: a prompt chunk (causal), or [root, draft nodes] with their positions
    /// and tree mask.
    pub fn batch(&self) -> Batch<'_> {
        match self.pending.as_ref().expect("a planned step") {
            Pending::Prefill { n, positions } => Batch {
                tokens: &self.committed[self.prefilled..self.prefilled + n],
                positions,
                mask: None,
            },
            Pending::Rebuild { from, n, positions } => Batch {
                tokens: &self.committed[*from..from + n],
                positions,
                mask: None,
            },
            Pending::Round(Planned { lin, .. }) => Batch {
                tokens: &lin.tokens,
                positions: &lin.positions,
                mask: Some(&lin.mask),
            },
        }
    }

    /// What the planned rows need from the output layer: the prompt's last row gets full
    /// logits (the first token is sampled from them), earlier chunks nothing; a round's rows
    /// argmaxes (greedy) or full logits (sampling: screened rows where each draw re-scores its
    /// candidates, [`Session::rescores`]).
    pub fn needs(&self) -> RowNeeds {
        match self.pending.as_ref().expect("a planned step") {
            Pending::Prefill { n, .. } => RowNeeds {
                logits: if self.prefilled + n == self.prompt_len {
                    Logits::Full
                } else {
                    Logits::None
                },
                last_only: true,
            },
            Pending::Rebuild { .. } => RowNeeds {
                logits: Logits::None,
                last_only: true,
            },
            Pending::Round(_) => RowNeeds {
                logits: match (self.greedy, self.drafter.candidates()) {
                    _ if self.process.as_ref().is_some_and(Processor::greedy_rows) => {
                        Logits::Screened
                    }
                    _ if self.process.is_some() => Logits::Full,
                    (true, 0) => Logits::Argmax,
                    (true, k) => Logits::ArgmaxTop(k),
                    (false, _) if self.rescores() => Logits::Screened,
                    (false, _) => Logits::Full,
                },
                last_only: false,
            },
        }
    }
}
