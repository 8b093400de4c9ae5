//! The drafters a campaign trains: what differs between DART, DFlash and PARD (their networks,
//! the positions a step draws, their losses, held-out evaluations and published layouts), so
//! that the campaign's loop, store and data are written once.

use super::Params;
use crate::drafters::dart::DartConfig;
use crate::drafters::dflash::DflashConfig;
use crate::drafters::registry::MethodEntry;
use crate::drafters::vocab::DraftVocab;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::train::data::Sample;
use crate::train::dflash::net::{CResult, FrozenHead};
use crate::train::run::{self, cerr, Data, Eval};
use crate::train::{dart, dflash, pard};
use crate::types::TokenId;
use candle_core::{DType, Tensor};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Held-out positions evaluated per sample (evenly spaced).
const EVAL_ANCHORS: usize = 32;

/// PARD's longest trained or evaluated sequence in tokens (its published run's).
const PARD_MAX_SEQ: usize = 384;

/// Which drafter a campaign trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CampaignMethod {
    /// DART: one layer, mask slots after the last real slot (the campaign of issue #23).
    Dart,
    /// DFlash: block diffusion over the target's features (its block drafts are what
    /// DFlash-tree and CPS build on).
    Dflash,
    /// PARD: a small mask-token model of the target's family, COD's layout (`train::pard`).
    Pard,
}

impl CampaignMethod {
    /// The method's name in the table: the campaign's default directory's too.
    pub fn name(self) -> &'static str {
        self.entry().name
    }

    /// The paper's spelling.
    pub fn label(self) -> &'static str {
        match self {
            CampaignMethod::Dart => "DART",
            CampaignMethod::Dflash => "DFlash",
            CampaignMethod::Pard => "PARD",
        }
    }

    /// `$HOME/.cache/paradraft/campaign/<name>`: outside any work tree, so a campaign outlives
    /// clones.
    pub fn default_dir(self) -> PathBuf {
        dirs::home_dir()
            .unwrap_or_else(|| PathBuf::from("."))
            .join(".cache/paradraft/campaign")
            .join(self.name())
    }

    /// The method-table entry of the drafter it trains (its name, its committed drafter).
    pub fn entry(self) -> &'static MethodEntry {
        match self {
            CampaignMethod::Dart => &crate::drafters::dart::METHOD,
            CampaignMethod::Dflash => &crate::drafters::dflash::METHOD,
            CampaignMethod::Pard => &crate::drafters::pard::METHOD,
        }
    }

    /// The committed drafter a campaign without a checkpoint starts from (and its weights
    /// replace): the table's directory for the method.
    pub fn published(self) -> PathBuf {
        self.entry()
            .default_drafter_dir()
            .unwrap_or_else(|| PathBuf::from("drafters").join(self.name()))
    }

    /// The campaign's settings for this drafter. DFlash's loss decays over the block as in its
    /// paper (γ = 7); since a lent GPU trained it (2026-11-27, ending at 3e-5 on 2,048 blocks a
    /// step), the CPU campaign goes on at DART's 1e-4 rather than the 3e-4 it began with. Both
    /// take sampled answers, labelled by the target along its greedy path. PARD's published
    /// drafter saw half an epoch of the greedy answers (cosine from 4e-4): its campaign goes on
    /// at a constant 2e-4 (γ and the anchors are COD's to decide, unused), and distils nothing
    /// new: the 20,404 greedy and 87,327 sampled answers are over 40 hours of its steps (4
    /// sequences in ~10 s on 2 vCPUs) before any is seen twice, and half of each hour went to
    /// distilling.
    pub fn params(self) -> Params {
        match self {
            CampaignMethod::Dart => Params::default(),
            CampaignMethod::Pard => Params {
                lr: 2e-4,
                distill_share: 0.0,
                ..Params::default()
            },
            CampaignMethod::Dflash => Params {
                gamma: 7.0,
                ..Params::default()
            },
        }
    }

    /// Refuses settings this drafter cannot be trained with.
    pub fn check(self, p: &Params) -> Result<()> {
        match self {
            // DART's γ is the chain decay per depth (a probability), DFlash's a decay length.
            CampaignMethod::Dart if p.gamma > 1.0 => Err(Error::BadRequest(
                "campaign settings: DART's gamma must be in (0, 1]".into(),
            )),
            _ => Ok(()),
        }
    }

    /// An exported (or published) drafter of `target` as a trainable network with its draft
    /// vocabulary.
    pub fn load(self, dir: &Path, target: &Model) -> Result<(Student, DraftVocab)> {
        Ok(match self {
            CampaignMethod::Dart => {
                let (n, v) = dart::load_exported(dir)?;
                (Student::Dart(n), v)
            }
            CampaignMethod::Dflash => {
                let (n, v) = dflash::load_exported(dir, target.config.vocab_size)?;
                (Student::Dflash(n), v)
            }
            CampaignMethod::Pard => {
                let (net, mask, v) = pard::load_exported(dir, target)?;
                let (cfg, path) = crate::model::read_config_json(dir, "PARD drafter config.json")?;
                let k = match cfg.get("pard_k").map(|k| k.as_u64()) {
                    None => pard::Cod::default().k,
                    Some(Some(k)) if (2..=64).contains(&k) => k as usize,
                    Some(_) => {
                        return Err(Error::BadRequest(format!(
                            "{}: pard_k must be an integer in 2..=64",
                            path.display()
                        )))
                    }
                };
                let cod = pard::Cod {
                    k,
                    ..Default::default()
                };
                (Student::Pard { net, mask, cod }, v)
            }
        })
    }
}

/// A drafter's configuration: what a checkpoint's tensors are read as.
#[derive(Clone, Debug)]
pub enum Shape {
    Dart(DartConfig),
    Dflash(DflashConfig),
    Pard {
        config: crate::model::Config,
        mask: TokenId,
        cod: pard::Cod,
    },
}

impl Shape {
    pub fn method(&self) -> CampaignMethod {
        match self {
            Shape::Dart(_) => CampaignMethod::Dart,
            Shape::Dflash(_) => CampaignMethod::Dflash,
            Shape::Pard { .. } => CampaignMethod::Pard,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Shape::Dart(c) => c.to_json(),
            Shape::Dflash(c) => c.to_json(),
            Shape::Pard { config, mask, cod } => {
                let mut v = crate::drafters::parts::drafter_layers_json(config, "llama", "PARD");
                v["pard_token"] = mask.0.into();
                v["cod"] = serde_json::to_value(cod).unwrap_or_default();
                v
            }
        }
    }

    /// The network of this shape holding `t` (every tensor checked).
    pub fn net(&self, t: &HashMap<String, Tensor>) -> CResult<Student> {
        Ok(match self {
            Shape::Dart(c) => Student::Dart(dart::net::Net::from_tensors(c.clone(), t)?),
            Shape::Dflash(c) => Student::Dflash(dflash::net::Net::from_tensors(c.clone(), t)?),
            Shape::Pard { config, mask, cod } => Student::Pard {
                net: pard::net::Net::from_tensors(config.clone(), t)?,
                mask: *mask,
                cod: *cod,
            },
        })
    }

    /// The target layers the teacher taps (the drafter's own, then the target's last layer
    /// for the distillation loss) and the width of the drafter's part.
    pub fn taps(&self, target: &Model) -> Result<(Vec<usize>, usize)> {
        let (n, h) = (target.config.n_layers, target.config.hidden_size);
        match self {
            Shape::Dart(_) => Ok((dart::stored_taps(target)?, 3 * h)),
            Shape::Dflash(c) => {
                if c.num_target_layers != n {
                    return Err(Error::BadRequest(format!(
                        "the DFlash drafter was made for a {}-layer target, this one has {n}",
                        c.num_target_layers
                    )));
                }
                let mut t = c.target_layer_ids.clone();
                t.push(n - 1);
                Ok((t, c.target_layer_ids.len() * h))
            }
            // PARD's network reads no target features: the last layer is the teacher's.
            Shape::Pard { config, .. } => {
                if config.hidden_size != h || config.vocab_size != target.config.vocab_size {
                    return Err(Error::BadRequest(
                        "the PARD drafter does not share this target's width and vocabulary".into(),
                    ));
                }
                Ok((vec![n - 1], 0))
            }
        }
    }

    /// Refuses settings this drafter cannot be trained with.
    pub fn check(&self, p: &Params) -> Result<()> {
        self.method().check(p)
    }
}

/// A trainable drafter.
pub enum Student {
    Dart(dart::net::Net),
    Dflash(dflash::net::Net),
    Pard {
        net: pard::net::Net,
        mask: TokenId,
        cod: pard::Cod,
    },
}

impl Student {
    pub fn shape(&self) -> Shape {
        match self {
            Student::Dart(n) => Shape::Dart(n.config.clone()),
            Student::Dflash(n) => Shape::Dflash(n.config.clone()),
            Student::Pard { net, mask, cod } => Shape::Pard {
                config: net.config.clone(),
                mask: *mask,
                cod: *cod,
            },
        }
    }

    pub fn vars(&self) -> &run::Vars {
        match self {
            Student::Dart(n) => &n.vars,
            Student::Dflash(n) => &n.vars,
            Student::Pard { net, .. } => &net.vars,
        }
    }

    /// The positions a step trains on in sample `s`: up to `n` DART prefixes or DFlash block
    /// anchors, uniformly without replacement, sorted; for PARD, COD's mask chain length at
    /// every anchor + 1 of the sample cut to its longest sequence (`n` unused: COD decides).
    pub(super) fn positions(&self, s: &Sample, n: usize, rng: &mut ChaCha8Rng) -> Vec<usize> {
        match self {
            Student::Dart(_) => dart::sample_prefixes(s, n, rng),
            Student::Dflash(_) => dflash::batch::sample_anchors(s, n, rng),
            Student::Pard { cod, .. } => {
                pard::cod_lengths(s.tokens.len().min(PARD_MAX_SEQ), cod, rng)
            }
        }
    }

    /// The weighted mean loss of `items` (sample index, its positions), the depth-1 accuracy
    /// and the rows scored; `None` when nothing is labelled.
    pub(super) fn loss(
        &self,
        head: &FrozenHead,
        data: &Data,
        items: &[(usize, Vec<usize>)],
        p: &Params,
    ) -> Result<Option<(Tensor, f64, usize)>> {
        match self {
            Student::Dart(n) => dart::sequences_loss(n, head, data, items, p.gamma, p.kl_weight),
            Student::Dflash(n) => {
                let c = &n.config;
                let lb = dflash::batch::build(
                    data.target,
                    data.samples,
                    data.features,
                    items,
                    c.block_size,
                    TokenId(c.mask_token_id),
                    data.vocab,
                    p.gamma,
                    data.teacher_from,
                )
                .map_err(cerr)?;
                let rows = lb.weights.iter().filter(|&&w| w > 0.0).count();
                Ok(dflash::loss(n, head, &lb, p.kl_weight)
                    .map_err(cerr)?
                    .map(|(l, acc1)| (l, acc1, rows)))
            }
            Student::Pard { net, mask, .. } => pard::teacher::campaign_loss(
                net,
                head,
                data,
                items,
                *mask,
                PARD_MAX_SEQ,
                p.kl_weight,
            ),
        }
    }

    /// Held-out acceptance: DART's chain over its depths, DFlash's block drafts, PARD's chain
    /// of K drafts from one pass (the anchor and K − 1 masks).
    pub(super) fn evaluate(
        &self,
        head: &FrozenHead,
        data: &Data,
        held_out: &[usize],
    ) -> Result<Eval> {
        match self {
            Student::Dart(n) => dart::evaluate(n, data, held_out, EVAL_ANCHORS),
            Student::Dflash(n) => {
                dflash::evaluate(n, data, held_out, n.config.block_size, EVAL_ANCHORS)
            }
            Student::Pard { net, mask, cod } => {
                let d = pard::Data {
                    target: data.target,
                    samples: data.samples,
                    train: vec![],
                    vocab: data.vocab,
                    mask: *mask,
                    device: data.device.clone(),
                    max_seq: PARD_MAX_SEQ,
                };
                pard::evaluate(net, head, &d, cod, held_out, cod.k, EVAL_ANCHORS)
            }
        }
    }

    /// Writes the drafter in its published layout, weights in f16.
    pub fn export(&self, vocab: &DraftVocab, dir: &Path) -> Result<()> {
        match self {
            Student::Dart(n) => dart::export(n, vocab, dir, DType::F16),
            Student::Dflash(n) => {
                let target_vocab = n.config.layers.vocab_size;
                dflash::export(n, vocab, target_vocab, dir, DType::F16)
            }
            Student::Pard { net, mask, cod } => {
                pard::export(net, *mask, cod, vocab, dir, DType::F16)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A campaign trains a method of the table, starts from that method's committed drafter
    /// and writes where `generate` loads it from.
    #[test]
    fn campaigns_train_methods_of_the_table() {
        for m in [
            CampaignMethod::Dart,
            CampaignMethod::Dflash,
            CampaignMethod::Pard,
        ] {
            let e = m.entry();
            assert!(
                crate::drafters::methods::METHODS
                    .iter()
                    .any(|t| std::ptr::eq(*t, e)),
                "{}",
                m.name()
            );
            assert_eq!(Some(m.published()), e.default_drafter_dir());
            assert!(m.published().join("config.json").is_file(), "{}", m.name());
        }
    }
}
