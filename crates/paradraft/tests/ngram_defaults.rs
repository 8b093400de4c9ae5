//! The default n-gram models on first use (issue #27): built from the shipped corpus into the
//! cache, reused afterwards, rebuilt with a message when the cached file is damaged; a hand-built
//! file for another tokenizer is passed over; an unwritable home is named in the error.

use paradraft::ngram::defaults::{self, Kind};
use paradraft::ngram::stamp_of;

#[test]
fn default_ngram_models_are_built_once_and_rebuilt_when_damaged() {
    let path = paradraft::fetch::ensure_default_model().unwrap();
    let lm = paradraft::model::load(&path).unwrap();
    let tok = &lm.tokenizer;
    let home = tempfile::tempdir().unwrap();
    // What a load opens ahead: nothing before the build (and nothing is built).
    assert!(defaults::built_trie_in(tok, home.path(), None).is_none());
    assert!(!defaults::cache_path(home.path(), tok, Kind::Trie).exists());

    let (p, t) = defaults::trie_in(tok, home.path(), None).unwrap();
    assert_eq!(p, defaults::cache_path(home.path(), tok, Kind::Trie));
    assert!(t.count(&[]) > 1_000_000, "{} windows", t.count(&[]));
    t.check_stamp(stamp_of(tok), &p).unwrap();
    let len = std::fs::metadata(&p).unwrap().len();
    let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();

    // Cached: the same file, not rebuilt.
    let (p2, t2) = defaults::trie_in(tok, home.path(), None).unwrap();
    assert_eq!(p2, p);
    let windows = t.count(&[]);
    assert_eq!(t2.count(&[]), windows);
    assert_eq!(std::fs::metadata(&p).unwrap().modified().unwrap(), mtime);
    // Opened ahead once built: the same table.
    let ahead = defaults::built_trie_in(tok, home.path(), None).unwrap();
    assert_eq!(ahead.count(&[]), windows);
    // (The tries map the file: let go of them before damaging it in place.)
    drop((t, t2, ahead));

    // Truncated: detected on use and rebuilt to the same content.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len / 3)
        .unwrap();
    // Damaged: not opened ahead, and left for the load to rebuild (with its message).
    assert!(defaults::built_trie_in(tok, home.path(), None).is_none());
    assert_eq!(std::fs::metadata(&p).unwrap().len(), len / 3);
    let (_, t3) = defaults::trie_in(tok, home.path(), None).unwrap();
    assert_eq!(t3.count(&[]), windows);
    assert_eq!(std::fs::metadata(&p).unwrap().len(), len);

    // A hand-built file that does not fit (here: garbage) is passed over for the cache.
    let foreign = home.path().join("foreign.trie");
    std::fs::write(&foreign, b"not a trie").unwrap();
    let (p4, _) = defaults::trie_in(tok, home.path(), Some(foreign)).unwrap();
    assert_eq!(p4, p);

    // A home that cannot hold files: a clear error naming the path, before any work.
    let file = home.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let e = defaults::trie_in(tok, &file, None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("a-file") && e.contains("PARADRAFT_HOME"), "{e}");
}

/// Built apart from the trie so that the two builds share the cores.
#[test]
fn the_default_arpa_model_is_built_once_and_stamped() {
    let path = paradraft::fetch::ensure_default_model().unwrap();
    let lm = paradraft::model::load(&path).unwrap();
    let tok = &lm.tokenizer;
    let home = tempfile::tempdir().unwrap();
    let (a, m) = defaults::arpa_in(tok, home.path(), None).unwrap();
    assert_eq!(a, defaults::cache_path(home.path(), tok, Kind::Arpa));
    m.check_stamp(stamp_of(tok), &a).unwrap();
    let ids = tok.encode("The answer is").unwrap();
    assert!(m.ln_token(&ids[..2], ids[2]).is_finite());
    let mtime = std::fs::metadata(&a).unwrap().modified().unwrap();
    let (a2, _) = defaults::arpa_in(tok, home.path(), None).unwrap();
    assert_eq!(a2, a);
    assert_eq!(std::fs::metadata(&a).unwrap().modified().unwrap(), mtime);
}

/// `generate` opens the drafter's trie on the tokenizer while the target's weights load
/// (`DrafterConfig::on_tokenizer`); the drafters' load then takes that trie instead of opening
/// the file, and nothing holds it after them.
#[test]
fn the_load_takes_the_trie_opened_ahead() {
    use paradraft::drafters::speculative_config::{DrafterConfig, Method};
    let path = paradraft::fetch::ensure_default_model().unwrap();
    let lm = paradraft::model::load(&path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    let text = "The cat sat on the mat. The dog sat on the log. The cat ran.";
    std::fs::write(
        &corpus,
        format!("{}\n", serde_json::json!({ "text": text })),
    )
    .unwrap();
    let trie =
        paradraft::ngram::build_from_jsonl(&[corpus], &lm.tokenizer, 3, 1, |_, _| {}).unwrap();
    let file = dir.path().join("t.trie");
    trie.write(&file).unwrap();
    let cfg = DrafterConfig {
        method: Method::named("auto").unwrap(),
        sources: vec!["trie".into()],
        ngram: Some(file.clone()),
        ..Default::default()
    };
    let moved = dir.path().join("moved.trie");
    // Without a trie opened ahead the load opens the file: gone, it is an error naming it.
    std::fs::rename(&file, &moved).unwrap();
    let e = cfg.load(&path, &lm, 256).err().unwrap().to_string();
    assert!(e.contains("t.trie"), "{e}");
    // Opened ahead, then the file goes: the load takes the open trie.
    std::fs::rename(&moved, &file).unwrap();
    cfg.on_tokenizer(&lm.tokenizer);
    std::fs::rename(&file, &moved).unwrap();
    let set = cfg.load(&path, &lm, 256).unwrap();
    drop(set);
    // Let go with the drafters: a later load opens the file again.
    let e = cfg.load(&path, &lm, 256).err().unwrap().to_string();
    assert!(e.contains("t.trie"), "{e}");
    // A method that reads no trie opens none ahead.
    std::fs::rename(&moved, &file).unwrap();
    let pld = DrafterConfig {
        method: Method::named("pld").unwrap(),
        ngram: Some(file.clone()),
        ..cfg.clone()
    };
    pld.on_tokenizer(&lm.tokenizer);
    std::fs::rename(&file, &moved).unwrap();
    let e = cfg.load(&path, &lm, 256).err().unwrap().to_string();
    assert!(e.contains("t.trie"), "{e}");
}
