//! DiffuSpec's causal proxy (DiffuSpec §3.2, docs/diffuspec.md): a token-level 3-gram back-off language
//! model in ARPA form.
//!
//! - [`ArpaLm::read`]: an ARPA reader (`\data\` counts, `\k-grams:` sections of `log10 p`, the
//!   words and — below the top order — a `log10 backoff`, then `\end\`), order 1 to 3.
//! - [`ArpaLm::log10_prob`]: KenLM's back-off query: a stored n-gram's value, else the context's
//!   back-off (0 when the context is absent) plus the query one order down; unknown words are
//!   `<unk>`. Mid-sequence queries use the real context (no `<s>`).
//! - [`ArpaBuilder`]: the interpolated modified Kneser–Ney estimate KenLM's `lmplz` makes
//!   (adjusted counts — continuation counts below the top order, raw counts for n-grams that
//!   start with `<s>` — three discounts per order from counts of counts, the unigrams
//!   interpolated with the uniform distribution), written as ARPA. On a corpus too small for
//!   the discount formula (a count-of-counts of zero) an order falls back to D = 0.5, 1, 1.5.
//!
//! Token-level: the words are target token ids in decimal, so a corpus is tokenized with the
//! target's tokenizer ([`crate::ngram::for_each_document`]) and drafts are scored by id.

mod build;

pub use build::ArpaBuilder;

use super::grams::Grams;
use crate::error::{Error, Result};
use crate::types::TokenId;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{BufRead, Write};
use std::path::Path;

/// A multiplicative hasher for integer keys (the query's hot path).
#[derive(Default)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64)
    }
}

type Map<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

fn key2(u: u32, v: u32) -> u64 {
    ((u as u64) << 32) | v as u64
}

/// A context looked up once ([`ArpaLm::resolve`]): its length in words (0–2), its last word,
/// the bigram row of a two-word context and that bigram's back-off.
#[derive(Clone, Copy, Debug, Default)]
pub struct ArpaContext {
    n: usize,
    v: u32,
    uv: Option<usize>,
    bo: f32,
}

/// log10 of a probability of zero in ARPA files (KenLM's value for `<s>`).
pub const LOG10_ZERO: f32 = -99.0;

/// A back-off n-gram model of order 1–3.
pub struct ArpaLm {
    order: usize,
    words: Vec<String>,
    index: HashMap<String, u32>,
    unk: u32,
    /// Per word: (log10 p, log10 back-off).
    uni: Vec<(f32, f32)>,
    /// 2- and 3-grams in sorted rows (the query's hot path).
    grams: Grams,
    /// Word of each token id (words named by a decimal token id), `unk` for the others.
    token_word: Vec<u32>,
    /// The tokenizer the words are token ids of, when the file says (a comment line before
    /// `\data\` that KenLM skips: `# paradraft tokenizer=HEX vocab=N`).
    pub stamp: Option<crate::ngram::TrieStamp>,
}

impl ArpaLm {
    /// Refuses a model whose stamp names another tokenizer than `want` (`what` names the
    /// file); a model without a stamp (any ARPA file) is taken as it is.
    pub fn check_stamp(&self, want: crate::ngram::TrieStamp, what: &Path) -> Result<()> {
        match self.stamp {
            Some(s) if s != want => Err(Error::BadRequest(format!(
                "{} was built with another tokenizer (vocabulary {}, fingerprint {:016x}) than the target's (vocabulary {}, fingerprint {:016x})",
                what.display(),
                s.vocab_size,
                s.fingerprint,
                want.vocab_size,
                want.fingerprint
            ))),
            _ => Ok(()),
        }
    }

    pub fn order(&self) -> usize {
        self.order
    }

    /// Words in the model (the unigrams).
    pub fn vocab_len(&self) -> usize {
        self.words.len()
    }

    pub fn word(&self, i: u32) -> &str {
        &self.words[i as usize]
    }

    /// The index of `w`, `<unk>`'s for words the model does not know.
    pub fn word_index(&self, w: &str) -> u32 {
        self.index.get(w).copied().unwrap_or(self.unk)
    }

    /// The word of a target token.
    pub fn token_word(&self, t: TokenId) -> u32 {
        self.token_word.get(t.idx()).copied().unwrap_or(self.unk)
    }

    /// log10 P(w | context), with the context's last `order − 1` words used (KenLM's back-off
    /// query).
    pub fn log10_prob(&self, context: &[u32], w: u32) -> f32 {
        self.log10_next(&self.resolve(context), w)
    }

    /// The context's last `order − 1` words looked up once, for queries of many next words
    /// (a CPS beam's candidates).
    pub fn resolve(&self, context: &[u32]) -> ArpaContext {
        let n = context.len().min(self.order - 1);
        match &context[context.len() - n..] {
            [u, v] => {
                let uv = self.grams.bigram(*u, *v);
                ArpaContext {
                    n: 2,
                    v: *v,
                    uv,
                    bo: uv.map_or(0.0, |j| self.grams.bigram_entry(j).1),
                }
            }
            [v] => ArpaContext {
                n: 1,
                v: *v,
                uv: None,
                bo: 0.0,
            },
            _ => ArpaContext::default(),
        }
    }

    /// log10 P(w | a resolved context): the stored trigram, else its context's back-off plus
    /// the stored bigram (v, w), else v's back-off plus w's unigram.
    pub fn log10_next(&self, c: &ArpaContext, w: u32) -> f32 {
        if c.n == 2 {
            if let Some(p) = c.uv.and_then(|j| self.grams.trigram(j, w)) {
                return p;
            }
        }
        if c.n == 0 {
            return self.uni[w as usize].0;
        }
        c.bo + match self.grams.bigram(c.v, w) {
            Some(j) => self.grams.bigram_entry(j).0,
            None => self.uni[c.v as usize].1 + self.uni[w as usize].0,
        }
    }

    /// [`ArpaLm::resolve`] over target tokens.
    pub fn token_context(&self, context: &[TokenId]) -> ArpaContext {
        let n = context.len().min(self.order - 1);
        let mut c = [0u32; 2];
        for (i, &x) in context[context.len() - n..].iter().enumerate() {
            c[i] = self.token_word(x);
        }
        self.resolve(&c[..n])
    }

    /// ln P(t | a resolved context) over target tokens (what DiffuSpec's path score mixes with
    /// the drafter's natural-log probabilities).
    pub fn ln_next_token(&self, c: &ArpaContext, t: TokenId) -> f32 {
        self.log10_next(c, self.token_word(t)) * std::f32::consts::LN_10
    }

    /// log10 P(t | the last tokens of `context`) over target tokens.
    pub fn log10_token(&self, context: &[TokenId], t: TokenId) -> f32 {
        self.log10_next(&self.token_context(context), self.token_word(t))
    }

    /// [`ArpaLm::log10_token`] in natural log.
    pub fn ln_token(&self, context: &[TokenId], t: TokenId) -> f32 {
        self.log10_token(context, t) * std::f32::consts::LN_10
    }

    /// Reads an ARPA file; errors name the line and what is wrong.
    pub fn read(path: &Path) -> Result<Self> {
        let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        Self::parse(std::io::BufReader::new(f), path)
    }

    /// Parses ARPA text from `r` (`path` names it in errors).
    pub fn parse(mut r: impl BufRead, path: &Path) -> Result<Self> {
        // The whole text at once: lines and fields are then borrowed slices (a 70 MB model
        // reads in a third of the time it took line by line into owned strings).
        let mut text = String::new();
        r.read_to_string(&mut text)
            .map_err(|e| Error::io(path, e))?;
        Self::parse_str(&text, path)
    }

    /// Parses ARPA text (`path` names it in errors).
    pub fn parse_str(text: &str, path: &Path) -> Result<Self> {
        let bad = |line: usize, reason: String| Error::BadModelFile {
            path: path.to_path_buf(),
            format: "ARPA",
            reason: if line > 0 {
                format!("line {line}: {reason}")
            } else {
                reason
            },
        };
        let mut lines = text.split('\n').enumerate().map(|(i, l)| (i + 1, l));
        let mut next = || -> Result<Option<(usize, &str)>> {
            for (no, l) in lines.by_ref() {
                let t = l.trim();
                if !t.is_empty() {
                    return Ok(Some((no, t)));
                }
            }
            Ok(None)
        };
        // Header.
        let mut counts: Vec<usize> = vec![];
        let mut stamp = None;
        loop {
            match next()? {
                None => return Err(bad(0, "no \\data\\ section".into())),
                Some((_, "\\data\\")) => break,
                Some((_, l)) => {
                    if let Some(rest) = l.strip_prefix("# paradraft ") {
                        stamp = parse_stamp(rest);
                    }
                }
            }
        }
        let mut pending;
        loop {
            let Some((no, l)) = next()? else {
                return Err(bad(0, "the file ends in its \\data\\ header".into()));
            };
            if let Some(rest) = l.strip_prefix("ngram ") {
                let (k, n) = rest
                    .split_once('=')
                    .ok_or_else(|| bad(no, format!("{l:?} is not `ngram k=count`")))?;
                let (k, n): (usize, usize) = match (k.trim().parse(), n.trim().parse()) {
                    (Ok(k), Ok(n)) => (k, n),
                    _ => return Err(bad(no, format!("{l:?} is not `ngram k=count`"))),
                };
                if k != counts.len() + 1 {
                    return Err(bad(no, format!("ngram {k} out of order")));
                }
                counts.push(n);
            } else {
                pending = Some((no, l));
                break;
            }
        }
        let order = counts.len();
        if order == 0 || order > 3 {
            return Err(bad(
                0,
                format!("order {order}: this reader takes orders 1 to 3"),
            ));
        }
        let mut lm = ArpaLm {
            order,
            words: Vec::with_capacity(counts[0]),
            index: HashMap::with_capacity(counts[0]),
            unk: 0,
            uni: Vec::with_capacity(counts[0]),
            grams: Grams::default(),
            token_word: vec![],
            stamp,
        };
        let (mut bi, mut tri) = (vec![], vec![]);
        for k in 1..=order {
            let (no, l) = match pending.take() {
                Some(x) => x,
                None => next()?.ok_or_else(|| bad(0, format!("no \\{k}-grams: section")))?,
            };
            if l != format!("\\{k}-grams:") {
                return Err(bad(no, format!("expected \\{k}-grams:, found {l:?}")));
            }
            for i in 0..counts[k - 1] {
                let Some((no, l)) = next()? else {
                    return Err(bad(
                        0,
                        format!("\\{k}-grams: ends after {i} of {} entries", counts[k - 1]),
                    ));
                };
                if l.starts_with('\\') {
                    return Err(bad(
                        no,
                        format!(
                            "\\{k}-grams: has {i} entries, the header says {}",
                            counts[k - 1]
                        ),
                    ));
                }
                // At most log10 p, 3 words and a back-off: one more field is already wrong.
                let mut f = [""; 6];
                let mut nf = 0;
                for w in l.split_whitespace().take(6) {
                    f[nf] = w;
                    nf += 1;
                }
                let has_bo = k < order && nf == k + 2;
                if nf != k + 1 && !has_bo {
                    return Err(bad(no, format!("a {k}-gram line needs log10 p, {k} words and (below order {order}) an optional back-off: {l:?}")));
                }
                let num = |s: &str| -> Result<f32> {
                    s.parse::<f32>()
                        .ok()
                        .filter(|x| x.is_finite() && *x <= 0.0)
                        .ok_or_else(|| bad(no, format!("{s:?} is not a log10 probability")))
                };
                let p = num(f[0])?;
                let bo = if has_bo {
                    f[k + 1]
                        .parse::<f32>()
                        .ok()
                        .filter(|x| x.is_finite())
                        .ok_or_else(|| bad(no, format!("{:?} is not a log10 back-off", f[k + 1])))?
                } else {
                    0.0
                };
                if k == 1 {
                    let w = f[1].to_string();
                    if lm.index.contains_key(&w) {
                        return Err(bad(no, format!("unigram {w:?} appears twice")));
                    }
                    lm.index.insert(w.clone(), lm.words.len() as u32);
                    lm.words.push(w);
                    lm.uni.push((p, bo));
                    continue;
                }
                let mut ids = [0u32; 3];
                for (j, w) in f[1..=k].iter().enumerate() {
                    ids[j] = *lm
                        .index
                        .get(*w)
                        .ok_or_else(|| bad(no, format!("word {w:?} has no unigram")))?;
                }
                if k == 2 {
                    bi.push(((ids[0], ids[1]), (p, bo)));
                } else {
                    tri.push(((ids[0], ids[1], ids[2]), p));
                }
            }
        }
        match next()? {
            Some((_, "\\end\\")) => {}
            Some((no, l)) => return Err(bad(no, format!("expected \\end\\, found {l:?}"))),
            None => return Err(bad(0, "no \\end\\ (truncated?)".into())),
        }
        lm.unk = *lm
            .index
            .get("<unk>")
            .ok_or_else(|| bad(0, "no <unk> unigram".into()))?;
        lm.grams = Grams::new(lm.uni.len(), bi, tri, |i| lm.words[i as usize].clone())
            .map_err(|e| bad(0, e))?;
        lm.map_tokens();
        Ok(lm)
    }

    fn map_tokens(&mut self) {
        let ids: Vec<(usize, u32)> = self
            .words
            .iter()
            .enumerate()
            .filter_map(|(i, w)| w.parse::<u32>().ok().map(|t| (t as usize, i as u32)))
            .collect();
        let n = ids.iter().map(|x| x.0 + 1).max().unwrap_or(0);
        self.token_word = vec![self.unk; n];
        for (t, i) in ids {
            self.token_word[t] = i;
        }
    }
}

fn parse_stamp(s: &str) -> Option<crate::ngram::TrieStamp> {
    let mut fp = None;
    let mut vocab = None;
    for kv in s.split_whitespace() {
        match kv.split_once('=') {
            Some(("tokenizer", v)) => fp = u64::from_str_radix(v, 16).ok(),
            Some(("vocab", v)) => vocab = v.parse().ok(),
            _ => {}
        }
    }
    Some(crate::ngram::TrieStamp {
        vocab_size: vocab?,
        fingerprint: fp?,
    })
}

impl ArpaLm {
    /// Writes the model as ARPA text (entries in word order), atomically.
    pub fn write(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("arpa.tmp");
        let f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let mut o = std::io::BufWriter::new(f);
        let io = |e| Error::io(&tmp, e);
        let counts = [self.uni.len(), self.grams.bigrams(), self.grams.trigrams()];
        if let Some(st) = self.stamp {
            writeln!(
                o,
                "# paradraft tokenizer={:016x} vocab={}",
                st.fingerprint, st.vocab_size
            )
            .map_err(io)?;
        }
        writeln!(o, "\\data\\").map_err(io)?;
        for (k, c) in counts.iter().enumerate().take(self.order) {
            writeln!(o, "ngram {}={c}", k + 1).map_err(io)?;
        }
        let w = |i: u32| &self.words[i as usize];
        writeln!(o, "\n\\1-grams:").map_err(io)?;
        for (i, (p, bo)) in self.uni.iter().enumerate() {
            if self.order > 1 {
                writeln!(o, "{p}\t{}\t{bo}", w(i as u32)).map_err(io)?;
            } else {
                writeln!(o, "{p}\t{}", w(i as u32)).map_err(io)?;
            }
        }
        if self.order > 1 {
            writeln!(o, "\n\\2-grams:").map_err(io)?;
            for ((u, v), (p, bo)) in self.grams.iter_bigrams() {
                let (a, b) = (w(u), w(v));
                if self.order > 2 {
                    writeln!(o, "{p}\t{a} {b}\t{bo}").map_err(io)?;
                } else {
                    writeln!(o, "{p}\t{a} {b}").map_err(io)?;
                }
            }
        }
        if self.order > 2 {
            writeln!(o, "\n\\3-grams:").map_err(io)?;
            for ((u, v, c), p) in self.grams.iter_trigrams() {
                writeln!(o, "{p}\t{} {} {}", w(u), w(v), w(c)).map_err(io)?;
            }
        }
        writeln!(o, "\n\\end\\").map_err(io)?;
        o.flush().map_err(io)?;
        drop(o);
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::build::discounts;
    use super::*;

    const HAND: &str = "\\data\\
ngram 1=5
ngram 2=3
ngram 3=1

\\1-grams:
-1.0\t<unk>\t0
-99\t<s>\t-0.30103
-0.5\ta\t-0.2
-0.7\tb\t-0.1
-0.6\t</s>

\\2-grams:
-0.2\t<s> a\t-0.05
-0.3\ta b\t-0.4
-0.25\tb </s>

\\3-grams:
-0.1\t<s> a b

\\end\\
";

    fn parse(s: &str) -> Result<ArpaLm> {
        ArpaLm::parse(std::io::Cursor::new(s.as_bytes()), Path::new("test.arpa"))
    }

    /// Back-off values worked out by hand from the file above.
    #[test]
    fn a_hand_worked_file_gives_the_hand_computed_back_off_values() {
        let lm = parse(HAND).unwrap();
        let w = |s: &str| lm.word_index(s);
        let q = |ctx: &[&str], x: &str| {
            let c: Vec<u32> = ctx.iter().map(|s| w(s)).collect();
            lm.log10_prob(&c, w(x))
        };
        let close = |a: f32, b: f32| (a - b).abs() < 1e-6;
        assert!(close(q(&["<s>", "a"], "b"), -0.1), "stored trigram");
        // bo(<s> a) + bo(a) + p(</s>) = -0.05 - 0.2 - 0.6
        assert!(close(q(&["<s>", "a"], "</s>"), -0.85));
        // bo(a b) + bo(b) + p(a) = -0.4 - 0.1 - 0.5
        assert!(close(q(&["a", "b"], "a"), -1.0));
        // No (b a) bigram: its back-off is 0, then the stored bigram (a b).
        assert!(close(q(&["b", "a"], "b"), -0.3));
        // Unknown words are <unk>: bo(a) + p(<unk>).
        assert!(close(q(&["a"], "zebra"), -1.2));
        assert!(close(q(&[], "a"), -0.5));
        // Only the last two words of a longer context count.
        assert!(close(q(&["b", "b", "<s>", "a"], "b"), -0.1));
    }

    #[test]
    fn broken_files_are_refused_with_the_reason() {
        let cases: [(String, &str); 7] = [
            (HAND.replace("\\data\\", "\\dat\\"), "no \\data\\"),
            (HAND.replace("ngram 1=5", "ngram 1=6"), "entries"),
            (HAND.replace("-0.7\tb", "x\tb"), "not a log10 probability"),
            (HAND.replace("\\end\\\n", ""), "no \\end\\"),
            (HAND.replace("-0.3\ta b", "-0.3\ta c"), "has no unigram"),
            (HAND.replace("-1.0\t<unk>\t0", "-1.0\tc\t0"), "no <unk>"),
            (
                HAND.replace("ngram 3=1", "ngram 3=1\nngram 4=0"),
                "orders 1 to 3",
            ),
        ];
        for (text, want) in cases {
            let e = parse(&text).err().expect(want).to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn discounts_follow_the_counts_of_counts() {
        let d = discounts([10, 5, 3, 2]);
        let want = [0.5, 1.1, 3.0 - 4.0 * 0.5 * 2.0 / 3.0];
        for k in 0..3 {
            assert!((d[k] - want[k]).abs() < 1e-12, "{d:?}");
        }
        assert_eq!(discounts([3, 0, 1, 1]), [0.5, 1.0, 1.5]);
    }

    fn toks(v: &[u32]) -> Vec<TokenId> {
        v.iter().map(|&t| TokenId(t)).collect()
    }

    /// For any two-token context the model's probabilities over the words it can predict sum
    /// to 1, and writing then reading the ARPA file changes no query.
    #[test]
    fn a_built_model_is_normalised_and_round_trips() {
        let mut b = ArpaBuilder::new();
        let mut x = 7u32;
        for d in 0..40 {
            let len = 3 + d % 17;
            let doc: Vec<u32> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    // A skewed distribution over 30 tokens, repeating phrases.
                    ((x >> 16) % 30).min((x >> 8) % 30)
                })
                .collect();
            b.add_document(&toks(&doc));
        }
        b.add_document(&toks(&[1, 2, 3, 1, 2, 3, 1, 2, 4]));
        b.add_document(&[]);
        let lm = b.finish().unwrap();
        let predictable: Vec<u32> = (0..lm.vocab_len() as u32)
            .filter(|&i| lm.word(i) != "<s>")
            .collect();
        let sum = |ctx: &[u32]| -> f64 {
            predictable
                .iter()
                .map(|&w| 10f64.powf(lm.log10_prob(ctx, w) as f64))
                .sum()
        };
        let tw = |t: u32| lm.token_word(TokenId(t));
        let s = lm.word_index("<s>");
        let unk = lm.word_index("<unk>");
        for ctx in [
            vec![tw(1), tw(2)],
            vec![tw(2), tw(3)],
            vec![s, tw(1)],
            vec![tw(29), tw(0)],
            vec![unk, unk],
            vec![tw(3)],
            vec![],
        ] {
            let total = sum(&ctx);
            assert!((total - 1.0).abs() < 1e-4, "context {ctx:?}: Σ p = {total}");
        }
        // A seen continuation is likelier than the back-off alone.
        assert!(
            lm.log10_token(&toks(&[1, 2]), TokenId(3))
                > lm.log10_token(&toks(&[1, 2]), TokenId(29))
        );
        assert!(
            (lm.ln_token(&toks(&[1]), TokenId(2)) / lm.log10_token(&toks(&[1]), TokenId(2))
                - std::f32::consts::LN_10)
                .abs()
                < 1e-5
        );
        let dir = std::env::temp_dir().join(format!("arpa-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("lm.arpa");
        lm.write(&p).unwrap();
        let back = ArpaLm::read(&p).unwrap();
        assert_eq!(back.stamp, None);
        // A stamped model refuses another tokenizer.
        let st = |f| crate::ngram::TrieStamp {
            vocab_size: 32,
            fingerprint: f,
        };
        let mut stamped = back;
        stamped.stamp = Some(st(0xabc));
        stamped.write(&p).unwrap();
        let back = ArpaLm::read(&p).unwrap();
        assert_eq!(back.stamp, Some(st(0xabc)));
        assert!(back.check_stamp(st(0xabc), &p).is_ok());
        let e = back.check_stamp(st(0xabd), &p).unwrap_err().to_string();
        assert!(e.contains("another tokenizer"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
        for c in [[1u32, 2], [2, 3], [5, 6], [0, 0]] {
            for t in 0..32 {
                let (a, b) = (
                    lm.log10_token(&toks(&c), TokenId(t)),
                    back.log10_token(&toks(&c), TokenId(t)),
                );
                assert!((a - b).abs() < 1e-6, "{c:?} {t}: {a} vs {b}");
            }
        }
    }
}
