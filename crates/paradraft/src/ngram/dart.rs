//! DART's published `.trie` files (docs/dart.md), converted to [`NgramTrie`]'s layout.
//!
//! Their layout, little-endian and packed: `order: u64`, `node_count: u64`, then per node in
//! id order `token: i32`, `parent: u64`, `count: i32`, `children: u64` and that many
//! `(child_token: i32, child_id: u64)` pairs in hash-map order. Node 0 is the root. The file
//! carries no tokenizer, so the converter stamps the one the caller names and checks that every
//! token fits its vocabulary.

use super::trie::{NgramTrie, TrieStamp};
use crate::error::{Error, Result};
use std::io::Read;
use std::path::Path;

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::BadModelFile {
        path: path.to_path_buf(),
        format: "DART n-gram trie",
        reason: reason.into(),
    }
}

struct Reader<R> {
    r: R,
    at: u64,
}

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self, path: &Path) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.r.read_exact(&mut b).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                bad(path, format!("truncated at byte {}", self.at))
            } else {
                Error::io(path, e)
            }
        })?;
        self.at += N as u64;
        Ok(b)
    }
    fn u64(&mut self, path: &Path) -> Result<u64> {
        self.bytes::<8>(path).map(u64::from_le_bytes)
    }
    fn i32(&mut self, path: &Path) -> Result<i32> {
        self.bytes::<4>(path).map(i32::from_le_bytes)
    }
}

/// Reads a DART `.trie` file and converts it (children sorted by token, breadth-first ids).
pub fn convert(path: &Path, stamp: TrieStamp) -> Result<NgramTrie> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let size = f.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut r = Reader {
        r: std::io::BufReader::with_capacity(1 << 20, f),
        at: 0,
    };
    let order = r.u64(path)?;
    let n = r.u64(path)?;
    // A node takes at least 24 bytes; a count beyond that is a corrupt header.
    if order == 0 || order > 16 || n == 0 || n > size / 24 || n > u32::MAX as u64 {
        return Err(bad(path, format!("header: order {order}, {n} nodes")));
    }
    let n = n as usize;
    let (mut token, mut count, mut parent) = (vec![0u32; n], vec![0u32; n], vec![0u64; n]);
    // Children in CSR: node i's are kids[start[i]..start[i + 1]] as (token, id).
    let mut start = Vec::with_capacity(n + 1);
    let mut kids: Vec<(u32, u32)> = Vec::with_capacity(n);
    for i in 0..n {
        let t = r.i32(path)?;
        parent[i] = r.u64(path)?;
        let c = r.i32(path)?;
        let k = r.u64(path)?;
        if c < 0 || k > (n as u64) {
            return Err(bad(path, format!("node {i}: count {c}, {k} children")));
        }
        if i > 0 && (t < 0 || t as u32 >= stamp.vocab_size) {
            return Err(bad(
                path,
                format!(
                    "node {i}: token {t} outside the vocabulary of {} (another tokenizer?)",
                    stamp.vocab_size
                ),
            ));
        }
        token[i] = if i == 0 { u32::MAX } else { t as u32 };
        count[i] = c as u32;
        start.push(kids.len());
        for _ in 0..k {
            let ct = r.i32(path)?;
            let id = r.u64(path)?;
            if id == 0 || id >= n as u64 {
                return Err(bad(path, format!("node {i}: child id {id} of {n}")));
            }
            kids.push((ct as u32, id as u32));
        }
    }
    start.push(kids.len());
    // Breadth-first renumbering; each node must be reached exactly once, from its parent.
    let mut seen = vec![false; n];
    seen[0] = true;
    let mut order_ids = vec![0u32];
    let mut head = 0;
    while head < order_ids.len() {
        let node = order_ids[head] as usize;
        head += 1;
        let ch = &mut kids[start[node]..start[node + 1]];
        ch.sort_unstable();
        for w in 0..ch.len() {
            let (t, id) = ch[w];
            let id = id as usize;
            if w > 0 && ch[w - 1].0 == t {
                return Err(bad(
                    path,
                    format!("node {node}: token {t} twice among children"),
                ));
            }
            if seen[id] || parent[id] != node as u64 || token[id] != t {
                return Err(bad(
                    path,
                    format!("node {id} is not a proper child of {node}"),
                ));
            }
            seen[id] = true;
            order_ids.push(id as u32);
        }
    }
    // first[k] for the k-th node in breadth-first order.
    let m = order_ids.len();
    let mut first = Vec::with_capacity(m + 1);
    let mut next = 1u32;
    for &id in &order_ids {
        first.push(next);
        next += (start[id as usize + 1] - start[id as usize]) as u32;
    }
    first.push(m as u32);
    let tok: Vec<u32> = order_ids.iter().map(|&i| token[i as usize]).collect();
    let cnt: Vec<u32> = order_ids.iter().map(|&i| count[i as usize]).collect();
    NgramTrie::from_parts(order as usize, stamp, &tok, &cnt, &first).map_err(|e| match e {
        Error::BadModelFile { reason, .. } => bad(path, reason),
        e => e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ngram::TrieBuilder;
    use crate::types::TokenId;

    /// Writes `trie` in DART's layout with a shuffled node numbering and unsorted children,
    /// as a hash-map-based writer would.
    fn write_dart(trie: &NgramTrie, path: &Path) {
        // Rebuild the tree from queries: enumerate n-grams by walking the trie's arrays.
        let n = trie.len();
        let (token, count, first) = trie.arrays_for_test();
        // new id of breadth-first node k: a fixed permutation keeping the root at 0
        let perm: Vec<u64> = (0..n as u64)
            .map(|k| {
                if k == 0 {
                    0
                } else {
                    1 + (k * 7 + 3) % (n as u64 - 1)
                }
            })
            .collect();
        // Only valid when 7 is coprime with n − 1.
        let mut inv = vec![usize::MAX; n];
        for (k, &p) in perm.iter().enumerate() {
            assert_eq!(inv[p as usize], usize::MAX, "pick another multiplier");
            inv[p as usize] = k;
        }
        let mut parent = vec![0u64; n];
        for k in 0..n {
            for c in first[k]..first[k + 1] {
                parent[c as usize] = perm[k];
            }
        }
        let mut b = vec![];
        b.extend_from_slice(&(trie.order() as u64).to_le_bytes());
        b.extend_from_slice(&(n as u64).to_le_bytes());
        for &k in &inv {
            let t = if k == 0 { -1 } else { token[k] as i32 };
            b.extend_from_slice(&t.to_le_bytes());
            b.extend_from_slice(&parent[k].to_le_bytes());
            b.extend_from_slice(&(count[k] as i32).to_le_bytes());
            let kids: Vec<u32> = (first[k]..first[k + 1]).rev().collect();
            b.extend_from_slice(&(kids.len() as u64).to_le_bytes());
            for c in kids {
                b.extend_from_slice(&(token[c as usize] as i32).to_le_bytes());
                b.extend_from_slice(&perm[c as usize].to_le_bytes());
            }
        }
        std::fs::write(path, b).unwrap();
    }

    #[test]
    fn converts_dart_layout_exactly() {
        let stamp = TrieStamp {
            vocab_size: 50,
            fingerprint: 7,
        };
        let mut bld = TrieBuilder::new(3).unwrap();
        let doc: Vec<TokenId> = [5, 6, 7, 5, 6, 8, 5, 9, 49, 1, 2, 3, 2, 3, 4, 0]
            .iter()
            .map(|&t| TokenId(t))
            .collect();
        bld.add_document(&doc);
        bld.add_document(&doc[3..9]);
        let ours = bld.finish(stamp).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.trie");
        write_dart(&ours, &path);
        let conv = convert(&path, stamp).unwrap();
        assert_eq!(conv.arrays_for_test(), ours.arrays_for_test());
        // truncations are errors
        let bytes = std::fs::read(&path).unwrap();
        for cut in [0, 8, 15, 16, 30, bytes.len() - 1] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            assert!(convert(&path, stamp).is_err(), "cut at {cut}");
        }
        // a smaller vocabulary (another tokenizer) is refused
        std::fs::write(&path, &bytes).unwrap();
        let e = convert(
            &path,
            TrieStamp {
                vocab_size: 10,
                fingerprint: 7,
            },
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("vocabulary"), "{e}");
    }
}
