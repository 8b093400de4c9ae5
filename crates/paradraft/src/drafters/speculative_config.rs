//! Choosing a drafter: the methods, their options (vLLM's `--speculative-config` keys), and a
//! [`DrafterSet`] that loads the weights once and gives every request its own drafter.
//!
//! Shared by `generate`, `bench` and `serve`: the CLI only maps its flags onto
//! [`DrafterConfig`].

pub use super::registry::{DraftLength, DrafterConfig, Method, Mode};
use super::registry::{LoadArgs, Template};
use crate::error::{Error, Result};
use crate::model::{Loaded, Model};
use crate::sample::SamplingParams;
use crate::speculative::cps::AdlParams;
use crate::speculative::sizing::{CostCurve, GuardMemory, SavedCosts, Sizer};
use crate::speculative::{Drafter, Speculation, VerifyRule};
use std::path::{Path, PathBuf};

/// Options every method shares, never refused as unused.
const SHARED: [&str; 6] = [
    "method",
    "num_speculative_tokens",
    "draft_length",
    "tree_budget",
    "prompt_lookup_min",
    "prompt_lookup_max",
];

/// The command-line spelling of an option, for messages.
fn flag(key: &str) -> String {
    match key {
        "model" => "--draft-model (\"model\")".into(),
        k => format!("--{}", k.replace('_', "-")),
    }
}

/// A method in `mode`, as messages name it: `dflash`, `dflash-tree`, `diffuspec --no-cps`.
fn describe(entry: &super::registry::MethodEntry, mode: Option<Mode>) -> String {
    match mode {
        Some(m) if m != entry.default_mode() => match m {
            Mode::Sample | Mode::Tree => Method::label_for(entry, m),
            Mode::Greedy | Mode::Cps => format!("{} {}", entry.name, m.flag()),
        },
        _ => entry.name.to_string(),
    }
}

impl DrafterConfig {
    /// These options with the keys of a vLLM-style JSON object (`method` required) replacing
    /// theirs; unknown keys are refused. The older keys `cps`, `no_cps` and `fixed_draft` are
    /// read as `drafting` and `draft_length`.
    pub fn with_json(&self, js: &str) -> Result<DrafterConfig> {
        let bad = |e: String| Error::BadRequest(format!("speculative config: {e}"));
        let v: serde_json::Value = serde_json::from_str(js).map_err(|e| bad(e.to_string()))?;
        let mut obj = v
            .as_object()
            .cloned()
            .ok_or_else(|| bad("want a JSON object".into()))?;
        if !obj.contains_key("method") {
            return Err(bad("\"method\" is required".into()));
        }
        let legacy = [
            ("cps", "drafting", "cps"),
            ("no_cps", "drafting", "greedy"),
            ("fixed_draft", "draft_length", "fixed"),
        ];
        for (old, key, value) in legacy {
            match obj.remove(old) {
                None | Some(serde_json::Value::Bool(false)) => {}
                Some(serde_json::Value::Bool(true)) => {
                    if obj.get(key).is_some_and(|v| v != value) {
                        return Err(bad(format!("\"{old}\" and \"{key}\" disagree")));
                    }
                    obj.insert(key.into(), value.into());
                }
                Some(o) => return Err(bad(format!("\"{old}\" must be true or false, not {o}"))),
            }
        }
        let mut base = serde_json::to_value(self).map_err(|e| bad(e.to_string()))?;
        for (k, v) in obj {
            base[k] = v;
        }
        serde_json::from_value(base).map_err(|e| bad(e.to_string()))
    }

    /// The mode `method` drafts in with these options: its name's, else `drafting` where the
    /// method takes it, else its default.
    pub fn mode_of(&self, method: Method) -> Mode {
        method
            .mode
            .or(self.drafting.filter(|m| method.entry.modes.contains(m)))
            .unwrap_or(method.entry.default_mode())
    }

    /// Refuses options that none of `methods` would use (they would be silently ignored).
    pub fn check_used(&self, methods: &[Method]) -> Result<()> {
        let described = || {
            let names: Vec<String> = methods
                .iter()
                .map(|&m| describe(m.entry, Some(self.mode_of(m))))
                .collect();
            names.join(", ")
        };
        if let Some(mode) = self.drafting {
            let takes = |e: &super::registry::MethodEntry| {
                e.modes.contains(&mode) && e.default_mode() != mode
            };
            if !methods.iter().any(|m| m.mode.is_none() && takes(m.entry)) {
                let users: Vec<&str> = super::methods::METHODS
                    .iter()
                    .filter(|e| takes(e))
                    .map(|e| e.name)
                    .collect();
                return Err(Error::BadRequest(format!(
                    "{} has no effect with {} (it applies to {})",
                    mode.flag(),
                    described(),
                    users.join(", ")
                )));
            }
        }
        let given = serde_json::to_value(self).unwrap_or_default();
        let default = serde_json::to_value(DrafterConfig::default()).unwrap_or_default();
        let changed = given.as_object().into_iter().flatten().filter(|(k, v)| {
            !SHARED.contains(&k.as_str()) && *k != "drafting" && default.get(k.as_str()) != Some(*v)
        });
        for (key, _) in changed {
            if methods.iter().any(|&m| m.entry.reads(key, self.mode_of(m))) {
                continue;
            }
            let mut users = vec![];
            for e in super::methods::METHODS {
                for &(k, mode) in e.options {
                    if k == key {
                        users.push(describe(e, mode));
                    }
                }
            }
            return Err(Error::BadRequest(format!(
                "{} has no effect with {} (it applies to {})",
                flag(key),
                described(),
                users.join(", ")
            )));
        }
        Ok(())
    }

    /// Loads the drafter's weights once for a target (`target_path`, loaded as `lm`) whose
    /// requests hold up to `ctx` tokens.
    pub fn load<'t>(
        &self,
        target_path: &Path,
        lm: &'t Loaded,
        ctx: usize,
    ) -> Result<DrafterSet<'t>> {
        let k = self.num_speculative_tokens;
        let entry = self.method.entry;
        if !self.method.is_none() {
            if k == 0 || k >= ctx {
                return Err(Error::BadRequest(format!(
                    "num_speculative_tokens {k} must be between 1 and the context ({ctx} tokens) minus one"
                )));
            }
            if self.prompt_lookup_max > ctx {
                return Err(Error::BadRequest(format!(
                    "prompt_lookup_max {} exceeds the context ({ctx} tokens)",
                    self.prompt_lookup_max
                )));
            }
        }
        let args = LoadArgs {
            cfg: self,
            target_path,
            lm,
            ctx,
            dir: self
                .draft_model
                .clone()
                .or_else(|| entry.default_drafter_dir())
                .unwrap_or_default(),
            mode: self.mode_of(self.method),
            named: Method::named,
        };
        let loaded = (entry.load)(&args)?;
        let max_draft = loaded.max_draft;
        let sizing = self.draft_length;
        Ok(DrafterSet {
            template: loaded.template,
            max_draft,
            ctx,
            method: self.method,
            label: self.label(),
            adaptive: sizing != DraftLength::Fixed,
            adl: (sizing == DraftLength::Adl).then(|| {
                if max_draft >= 30 {
                    AdlParams::default()
                } else {
                    AdlParams::for_block(max_draft)
                }
            }),
            costs: None,
            sampled: None,
            guards: Default::default(),
            costs_file: None,
            config: serde_json::to_string(self).unwrap_or_default(),
        })
    }

    /// Starts loading this method's own weights on a thread of their own, to overlap the
    /// target's loading: call it before loading the target; [`DrafterConfig::load`] takes them
    /// up (a cold `paradraft generate --drafter auto` started ~60 ms after AR with DART's
    /// weights converted after the target's, 2-vCPU Zen 5).
    pub fn prefetch(&self) {
        if let Some(p) = self.method.entry.prefetch {
            p(self);
        }
    }

    /// What a load does with the target's tokenizer while the target's weights load
    /// ([`crate::model::ModelOptions::load_with`]): opens the n-gram trie this method reads
    /// ([`super::registry::open_trie_ahead`]).
    pub fn on_tokenizer(&self, tok: &crate::model::Tokenizer) {
        super::registry::open_trie_ahead(self, tok);
    }

    /// The name reports use: the method in its mode (`dflash-tree`, `dflash-cps`,
    /// `diffuspec-raw`), or which draft model.
    pub fn label(&self) -> String {
        let entry = self.method.entry;
        match entry.label {
            Some(f) => f(self),
            None => Method::label_for(entry, self.mode_of(self.method)),
        }
    }
}

/// A loaded drafter: weights shared by every request, per-request state made by
/// [`DrafterSet::create`].
pub struct DrafterSet<'t> {
    template: Box<dyn Template<'t> + 't>,
    /// The most nodes a drafter of this set proposes per round (0 without a drafter).
    pub max_draft: usize,
    ctx: usize,
    pub method: Method,
    /// The name reports use.
    pub label: String,
    /// Whether each round's draft is sized from measured costs ([`DrafterSet::measure_costs`]).
    pub adaptive: bool,
    /// Sized by DiffuSpec's adaptive draft length instead (these settings).
    pub adl: Option<AdlParams>,
    /// The target's verify-cost curve and the drafter's proposal-cost curve.
    costs: Option<(CostCurve, CostCurve)>,
    /// The target's verify-cost curve at T > 0 (full logits and the sampler for every row).
    sampled: Option<CostCurve>,
    /// The speed guard the last greedy / sampling request left.
    guards: [GuardMemory; 2],
    /// Where [`DrafterSet::measure_to`] keeps its curves between processes, less the suffix
    /// naming the widest forward ([`DrafterSet::keep_costs`]).
    costs_file: Option<PathBuf>,
    /// The whole configuration, as the name of its kept guards and costs ([`DrafterSet::persist`]).
    config: String,
}

impl<'t> DrafterSet<'t> {
    /// A drafter for one request sampled with `sampling` (drafters that sample draw with the
    /// target's keyed noise).
    pub fn create(&self, sampling: SamplingParams) -> Result<Box<dyn Drafter + 't>> {
        self.template.fork(self.ctx, sampling)
    }

    /// Bytes of a request's drafter cache per target position (0 without one): a server
    /// counts them in its KV pool.
    pub fn kv_bytes_per_slot(&self) -> usize {
        self.template.kv_bytes_per_slot()
    }

    /// The most bytes of target states a request's drafter of up to `ctx` positions holds
    /// before taking them in: a server counts them in its KV pool too.
    pub fn pending_bytes(&self, ctx: usize) -> usize {
        self.template.pending_bytes(ctx)
    }

    /// Measures what a proposal costs on this machine and keeps it with the target's verify
    /// costs `target` ([`CostCurve::measure`]), so that each round's draft is sized by what
    /// pays; nothing to do without a drafter or with fixed drafts. With `sampled` (requests
    /// that sample will come) also the verify cost at T > 0 ([`CostCurve::measure_sampled`]),
    /// which sizes their drafts.
    pub fn measure_costs(
        &mut self,
        model: &Model,
        target: &CostCurve,
        sampled: bool,
    ) -> Result<()> {
        if !self.adaptive || self.is_ar() {
            return Ok(());
        }
        let dc = self.drafter_curve(model)?;
        if sampled {
            self.sampled = Some(Self::sampled_curve(model, target)?);
        }
        self.costs = Some((target.clone(), dc));
        Ok(())
    }

    /// The drafter's proposal costs on this machine.
    fn drafter_curve(&self, model: &Model) -> Result<CostCurve> {
        let mut d = self.create(SamplingParams::default())?;
        CostCurve::measure_drafter(model, d.as_mut(), 64, self.max_draft, 3)
    }

    /// The target's verify costs at T > 0, up to `target`'s widest forward.
    fn sampled_curve(model: &Model, target: &CostCurve) -> Result<CostCurve> {
        let rows = target.points.last().map_or(32, |p| p.0);
        let t1 = SamplingParams {
            temperature: 1.0,
            ..Default::default()
        };
        CostCurve::measure_sampled(model, 64, 2, rows, t1)
    }

    /// This machine's verify costs (forwards of up to 32 rows) and the drafter's proposal
    /// costs when drafts are sized from them ([`DrafterSet::measure_to`]).
    pub fn measure(&mut self, model: &Model, sampled: bool) -> Result<Option<CostCurve>> {
        self.measure_to(model, 32, sampled)
    }

    /// This machine's verify costs for forwards of up to `rows` rows and the drafter's proposal
    /// costs when drafts are sized from them ([`DrafterSet::measure_costs`]), read from the
    /// file of [`DrafterSet::keep_costs`] where an earlier process kept them (what it lacks is
    /// measured and added); returns the verify-cost curve. The rounds correct a kept curve as
    /// they correct a fresh one ([`crate::speculative::sizing::LearnedCost`]).
    pub fn measure_to(
        &mut self,
        model: &Model,
        rows: usize,
        sampled: bool,
    ) -> Result<Option<CostCurve>> {
        if !self.adaptive || self.is_ar() {
            return Ok(None);
        }
        let file = self.costs_file.as_ref().map(|f| {
            let name = f.file_name().unwrap_or_default().to_string_lossy();
            f.with_file_name(format!("{name}-costs-{rows}.json"))
        });
        let kept = file.as_deref().map(SavedCosts::read).unwrap_or_default();
        let mut now = kept.clone();
        let c = match now.target.clone() {
            Some(c) => c,
            None => CostCurve::measure_up_to(model, 64, 2, rows)?,
        };
        now.target = Some(c.clone());
        let dc = match now.drafter.clone() {
            Some(d) => d,
            None => self.drafter_curve(model)?,
        };
        now.drafter = Some(dc.clone());
        if sampled && now.sampled.is_none() {
            now.sampled = Some(Self::sampled_curve(model, &c)?);
        }
        if sampled {
            self.sampled = now.sampled.clone();
        }
        self.costs = Some((c.clone(), dc));
        if let Some(f) = file.as_deref().filter(|_| now != kept) {
            now.write(f);
        }
        Ok(Some(c))
    }

    /// One request's drafter, draft limit, sizer (when costs were measured) and rule.
    pub fn speculation(
        &self,
        sampling: SamplingParams,
        rule: VerifyRule,
    ) -> Result<Speculation<'t>> {
        self.speculation_within(sampling, rule, self.ctx)
    }

    /// [`DrafterSet::speculation`] for a request that holds at most `ctx` tokens: its
    /// drafter's caches are sized to it, not to the whole context.
    pub fn speculation_within(
        &self,
        sampling: SamplingParams,
        rule: VerifyRule,
        ctx: usize,
    ) -> Result<Speculation<'t>> {
        Ok(Speculation {
            drafter: self.template.fork(ctx.min(self.ctx), sampling)?,
            max_draft: self.max_draft,
            sizer: self.costs.as_ref().map(|(t, d)| {
                let t = match &self.sampled {
                    Some(c) if !sampling.is_greedy() => c,
                    _ => t,
                };
                let s = Sizer::new(t.clone())
                    .with_draft_curve(Some(d.clone()))
                    .with_guard_memory(self.guards[usize::from(!sampling.is_greedy())].clone());
                match self.adl {
                    Some(p) => s.with_adl(p),
                    None => s,
                }
            }),
            rule,
        })
    }

    /// Keeps the speed guard's state and the measured costs ([`DrafterSet::keep_costs`]) in
    /// files under `dir` between processes that run this drafter set (its whole configuration)
    /// with the model file `model_path` loaded as `model` on this machine (CPU, kernels and
    /// thread count): `paradraft generate` answers each request in a fresh process, which would
    /// otherwise measure the costs and learn whether drafting pays here again in every request.
    pub fn persist(&mut self, dir: &Path, model_path: &Path, model: &Model) {
        let (label, hash, _) = self.keys(model_path, model);
        self.guards = ["greedy", "sampled"].map(|kind| {
            GuardMemory::persisted(dir.join(format!("{label}-{hash:016x}-{kind}.json")))
        });
        self.keep_costs(dir, model_path, model);
    }

    /// Keeps the costs [`DrafterSet::measure_to`] measures in a file under `dir` for later
    /// processes, keyed as [`DrafterSet::persist`]'s guards and by the program file (a rebuild
    /// measures again) and the widest forward: a server measuring forwards of up to 512 rows
    /// took 2.8 s before it opened its port (2-vCPU Zen 5, SmolLM2-135M, `auto`).
    pub fn keep_costs(&mut self, dir: &Path, model_path: &Path, model: &Model) {
        let (label, _, costs) = self.keys(model_path, model);
        self.costs_file = Some(dir.join(format!("{label}-{costs:016x}")));
    }

    /// The label files are named with, and the hashes of the guards' and the costs' keys.
    fn keys(&self, model_path: &Path, model: &Model) -> (String, u64, u64) {
        let path = std::fs::canonicalize(model_path).unwrap_or_else(|_| model_path.to_path_buf());
        let len = std::fs::metadata(&path).map_or(0, |m| m.len());
        let key = format!(
            "{}|{}|{}|{}|{}|{}",
            crate::runtime::isa::cpu_signature(),
            crate::runtime::current_threads(),
            path.display(),
            len,
            model.kv_dtype(),
            self.config
        );
        // The program: its size and modification time.
        let exe = std::env::current_exe()
            .and_then(std::fs::metadata)
            .map(|m| format!("{}|{:?}", m.len(), m.modified().ok()))
            .unwrap_or_default();
        // FNV-1a: a stable name for a key.
        let fnv = |k: &str| {
            k.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
            })
        };
        let hash = fnv(&key);
        let label: String = self
            .label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(40)
            .collect();
        (label, hash, fnv(&format!("{key}|{exe}")))
    }

    /// Whether requests decode without a drafter.
    pub fn is_ar(&self) -> bool {
        self.method.is_none()
    }

    /// The target layers whose states the drafters read.
    pub fn taps(&self) -> Vec<usize> {
        self.template.taps()
    }

    /// What the requests' drafters have done so far ([`Template::report`]).
    pub fn report(&self) -> Option<String> {
        self.template.report()
    }
}
