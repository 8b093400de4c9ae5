//! The 2- and 3-gram tables of an ARPA model in sorted, compressed-row form: bigrams grouped by
//! their first word, trigrams by their bigram context, successors ascending. A query finds its
//! context's row once and binary-searches the successor in a contiguous slice, so the
//! candidates of one context (a CPS beam's 15 tokens) share the same few cache lines instead
//! of each probing a hash table of hundreds of MB.

/// Sorted n-gram rows.
#[derive(Clone, Debug, Default)]
pub struct Grams {
    /// `bi_start[u]..bi_start[u + 1]`: the bigrams (u, ·) in `bi_w` / `bi_pb`.
    bi_start: Vec<u32>,
    bi_w: Vec<u32>,
    /// (log10 p, log10 back-off) per bigram.
    bi_pb: Vec<(f32, f32)>,
    /// `tri_start[j]..tri_start[j + 1]`: the trigrams whose context is bigram j.
    tri_start: Vec<u32>,
    tri_w: Vec<u32>,
    tri_p: Vec<f32>,
}

impl Grams {
    /// From bigrams ((u, v), (log10 p, log10 back-off)) and trigrams ((u, v, w), log10 p) over
    /// `words` words, in any order. A trigram whose context is not a bigram is refused (its
    /// words are named by `name`).
    pub fn new(
        words: usize,
        mut bi: Vec<((u32, u32), (f32, f32))>,
        mut tri: Vec<((u32, u32, u32), f32)>,
        name: impl Fn(u32) -> String,
    ) -> Result<Grams, String> {
        bi.sort_unstable_by_key(|e| e.0);
        tri.sort_unstable_by_key(|e| e.0);
        let mut g = Grams {
            bi_start: vec![0; words + 1],
            ..Default::default()
        };
        for &((u, v), pb) in &bi {
            g.bi_start[u as usize + 1] += 1;
            g.bi_w.push(v);
            g.bi_pb.push(pb);
        }
        for u in 0..words {
            g.bi_start[u + 1] += g.bi_start[u];
        }
        g.tri_start = vec![0; bi.len() + 1];
        let mut last = None;
        for &((u, v, w), p) in &tri {
            let j = match last {
                Some((uv, j)) if uv == (u, v) => j,
                _ => g.bigram(u, v).ok_or_else(|| {
                    format!(
                        "3-gram \"{} {} {}\" has no 2-gram \"{} {}\"",
                        name(u),
                        name(v),
                        name(w),
                        name(u),
                        name(v)
                    )
                })?,
            };
            last = Some(((u, v), j));
            g.tri_start[j + 1] += 1;
            g.tri_w.push(w);
            g.tri_p.push(p);
        }
        for j in 0..bi.len() {
            g.tri_start[j + 1] += g.tri_start[j];
        }
        Ok(g)
    }

    pub fn bigrams(&self) -> usize {
        self.bi_w.len()
    }

    pub fn trigrams(&self) -> usize {
        self.tri_w.len()
    }

    /// The index of bigram (u, v).
    #[inline]
    pub fn bigram(&self, u: u32, v: u32) -> Option<usize> {
        let u = u as usize;
        if u + 1 >= self.bi_start.len() {
            return None;
        }
        let (a, b) = (self.bi_start[u] as usize, self.bi_start[u + 1] as usize);
        self.bi_w[a..b].binary_search(&v).ok().map(|i| a + i)
    }

    /// (log10 p, log10 back-off) of bigram `j`.
    #[inline]
    pub fn bigram_entry(&self, j: usize) -> (f32, f32) {
        self.bi_pb[j]
    }

    /// log10 p of trigram (bigram j, w).
    #[inline]
    pub fn trigram(&self, j: usize, w: u32) -> Option<f32> {
        let (a, b) = (self.tri_start[j] as usize, self.tri_start[j + 1] as usize);
        self.tri_w[a..b]
            .binary_search(&w)
            .ok()
            .map(|i| self.tri_p[a + i])
    }

    /// Every bigram in (u, v) order: ((u, v), (log10 p, log10 back-off)).
    pub fn iter_bigrams(&self) -> impl Iterator<Item = ((u32, u32), (f32, f32))> + '_ {
        (0..self.bi_start.len().saturating_sub(1)).flat_map(move |u| {
            (self.bi_start[u] as usize..self.bi_start[u + 1] as usize)
                .map(move |j| ((u as u32, self.bi_w[j]), self.bi_pb[j]))
        })
    }

    /// Every trigram in (u, v, w) order.
    pub fn iter_trigrams(&self) -> impl Iterator<Item = ((u32, u32, u32), f32)> + '_ {
        self.iter_bigrams()
            .enumerate()
            .flat_map(move |(j, ((u, v), _))| {
                (self.tri_start[j] as usize..self.tri_start[j + 1] as usize)
                    .map(move |i| ((u, v, self.tri_w[i]), self.tri_p[i]))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_find_every_entry_and_nothing_else() {
        let bi = vec![
            ((2, 1), (-0.5, -0.1)),
            ((0, 3), (-0.2, 0.0)),
            ((2, 0), (-0.4, -0.2)),
        ];
        let tri = vec![((2, 1, 3), -0.7), ((2, 0, 1), -0.9), ((2, 1, 0), -0.8)];
        let g = Grams::new(4, bi, tri, |w| w.to_string()).unwrap();
        assert_eq!((g.bigrams(), g.trigrams()), (3, 3));
        let j = g.bigram(2, 1).unwrap();
        assert_eq!(g.bigram_entry(j), (-0.5, -0.1));
        assert_eq!(g.trigram(j, 3), Some(-0.7));
        assert_eq!(g.trigram(j, 0), Some(-0.8));
        assert_eq!(g.trigram(j, 2), None);
        assert_eq!(g.bigram(1, 2), None);
        assert_eq!(g.bigram(9, 0), None);
        assert_eq!(
            g.iter_trigrams().collect::<Vec<_>>(),
            vec![((2, 0, 1), -0.9), ((2, 1, 0), -0.8), ((2, 1, 3), -0.7)]
        );
        let e = Grams::new(4, vec![], vec![((1, 2, 3), -1.0)], |w| format!("w{w}")).unwrap_err();
        assert!(e.contains("w1 w2"), "{e}");
    }
}
