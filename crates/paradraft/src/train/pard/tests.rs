//! Unit tests of the PARD trainer (COD layout, batches).

use super::*;
use std::collections::BTreeSet;

fn toks(v: &[u32]) -> Vec<TokenId> {
    v.iter().map(|&t| TokenId(t)).collect()
}

/// A hand-worked example: 4 tokens, one chain of 2 masks after anchor 0.
#[test]
fn layout_of_a_hand_worked_example() {
    let vocab = DraftVocab::full(32);
    let Layout {
        tokens: t,
        positions: pos,
        ranges,
        out,
    } = layout(&toks(&[10, 11, 12, 13]), &[(0, 2)], TokenId(3), &vocab);
    assert_eq!(t, toks(&[10, 11, 12, 13, 3, 3]));
    assert_eq!(pos, vec![0, 1, 2, 3, 1, 2]);
    assert_eq!(
        ranges,
        vec![
            [(0, 1), (0, 0)],
            [(0, 2), (0, 0)],
            [(0, 3), (0, 0)],
            [(0, 4), (0, 0)],
            // Mask 1 (copy 1, position 1): token 0 and itself.
            [(0, 1), (4, 5)],
            // Mask 2 (copy 2, position 2): token 0, mask 1 and itself.
            [(0, 1), (4, 6)],
        ]
    );
    // (slot, label, subtask): real slots predict the next token; mask j after anchor 0
    // predicts token j + 1; the last real slot has no label.
    assert_eq!(
        out,
        vec![(0, 11, 1), (1, 12, 1), (2, 13, 1), (4, 12, 2), (5, 13, 3)]
    );
}

/// The anchor form holds exactly the paper's copies: for every slot, the (copy, position)
/// pairs it sees are those the copies' attention rule allows, and its label is the copy's.
#[test]
fn layout_equals_the_copies_definition() {
    let s = 9;
    let tokens: Vec<TokenId> = (0..s as u32).map(|i| TokenId(20 + i)).collect();
    let vocab = DraftVocab::full(64);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let cod = Cod {
        k: 5,
        r: 0.8,
        r_min: 0.3,
    };
    let chains = cod_chains(s, &cod, &mut rng);
    assert!(chains.iter().any(|c| c.1 >= 2), "{chains:?}");
    let Layout {
        positions: pos,
        ranges,
        out,
        ..
    } = layout(&tokens, &chains, TokenId(3), &vocab);
    // (copy, position) of every slot.
    let mut cp: Vec<(usize, usize)> = (0..s).map(|i| (0, i)).collect();
    for &(a, l) in &chains {
        for j in 1..=l {
            cp.push((j, (a + j as i64) as usize));
        }
    }
    for (slot, &(c, p)) in cp.iter().enumerate() {
        assert_eq!(pos[slot] as usize, p);
        let seen: BTreeSet<(usize, usize)> = ranges[slot]
            .iter()
            .flat_map(|&(a, b)| (a..b).map(|k| cp[k as usize]))
            .collect();
        let mut want: BTreeSet<(usize, usize)> = BTreeSet::new();
        if c == 0 {
            want.extend((0..=p).map(|q| (0, q)));
        } else {
            want.extend((0..(p + 1).saturating_sub(c)).map(|q| (0, q)));
            want.extend((1..=c).map(|cc| (cc, p + cc - c)));
        }
        assert_eq!(seen, want, "slot {slot} = copy {c}, position {p}");
        let label = out.iter().find(|o| o.0 as usize == slot);
        if p + 1 < s {
            assert_eq!(label, Some(&(slot as u32, 20 + p as u32 + 1, c as u8 + 1)));
        } else {
            assert_eq!(label, None);
        }
    }
}

/// Copy i keeps ⌊S·max(r^i, r_min)⌋ positions as chains (every kept mask keeps the masks
/// before it); with the paper's settings the layout holds ≈ 3.37 S slots; a copy that
/// would keep nothing ends them.
#[test]
fn cod_keeps_the_paper_counts_in_chains() {
    let s = 400;
    let cod = Cod::default();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let chains = cod_chains(s, &cod, &mut rng);
    for i in 1..cod.k {
        let n = chains.iter().filter(|c| c.1 >= i).count();
        // Wrapped successors (anchors below −1) are dropped: at most i − 1 of them.
        let want = cod.kept(s, i);
        assert!(
            n <= want && n + i > want,
            "copy {i}: {n} chains, want {want}"
        );
    }
    let kept: usize = (1..cod.k).map(|i| cod.kept(s, i)).sum();
    assert_eq!(
        (0..cod.k)
            .map(|i| if i == 0 { s } else { cod.kept(s, i) })
            .collect::<Vec<_>>(),
        // 0.7² is 0.48999… in binary floating point, as in the reference's Python: 195.
        vec![400, 280, 195, 137, 96, 80, 80, 80]
    );
    let frac = (s + kept) as f64 / s as f64;
    assert!((frac - 3.37).abs() < 0.01, "{frac}");
    assert!(cod_chains(
        2,
        &Cod {
            k: 8,
            r: 0.3,
            r_min: 0.0
        },
        &mut rng
    )
    .is_empty());
    // r = 1: every copy whole (all chains of K − 1 masks but the last anchors').
    let all = cod_chains(
        10,
        &Cod {
            k: 4,
            r: 1.0,
            r_min: 0.0,
        },
        &mut rng,
    );
    assert!(all.iter().filter(|c| c.0 <= 6).all(|c| c.1 == 3), "{all:?}");
}
