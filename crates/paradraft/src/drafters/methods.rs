//! The table of drafting methods, and finding one by name. Adding a drafter = one module
//! declaring its `registry::MethodEntry` + one line in [`METHODS`].

use super::registry::{Method, MethodEntry, Mode, NONE};
use crate::error::{Error, Result};
use serde::Deserialize;

/// Every method, in the order `--help` lists them.
pub static METHODS: &[&MethodEntry] = &[
    &NONE,
    &super::pld::METHOD,
    &super::draft_model::METHOD,
    &super::dflash::METHOD,
    &super::dart::METHOD,
    &super::pard::METHOD,
    &super::diffuspec::METHOD,
    &super::auto::METHOD,
];

impl Method {
    /// `auto`, every source at once: what `generate` and `bench` draft with by default.
    pub fn auto() -> Method {
        Method {
            entry: &super::auto::METHOD,
            mode: None,
        }
    }

    /// The method named `name` (`_` read as `-`), e.g. `dart`, `dflash-tree`, `diffuspec-raw`.
    pub fn named(name: &str) -> Result<Method> {
        let want = name.replace('_', "-");
        for e in METHODS {
            if e.name == want {
                return Ok(Method {
                    entry: e,
                    mode: None,
                });
            }
            for &m in e.modes.iter().skip(1) {
                if want.strip_prefix(e.name).and_then(|r| r.strip_prefix('-')) == Some(m.suffix()) {
                    return Ok(Method {
                        entry: e,
                        mode: Some(m),
                    });
                }
            }
        }
        Err(Error::BadRequest(format!(
            "unknown drafter {name:?} (known: {})",
            Method::listed()
                .iter()
                .map(|m| m.0.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }

    /// What `--help` lists: every method, and its sampled and tree modes, with a description.
    pub fn listed() -> Vec<(Method, String)> {
        let mut out = vec![];
        for e in METHODS {
            out.push((
                Method {
                    entry: e,
                    mode: None,
                },
                e.about.to_string(),
            ));
            for &m in e.modes.iter().skip(1) {
                if matches!(m, Mode::Sample | Mode::Tree) {
                    let about = format!("{}: {}", e.name, m.about());
                    out.push((
                        Method {
                            entry: e,
                            mode: Some(m),
                        },
                        about,
                    ));
                }
            }
        }
        out
    }
}

impl std::str::FromStr for Method {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Method::named(s)
    }
}

impl<'de> Deserialize<'de> for Method {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Method::named(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drafters::speculative_config::DrafterConfig;

    /// Every listed name parses back to its method; names are unique; modes are the entry's.
    #[test]
    fn every_method_and_mode_is_named_once() {
        let listed = Method::listed();
        let mut names: Vec<String> = listed.iter().map(|m| m.0.to_string()).collect();
        for (m, _) in &listed {
            assert_eq!(Method::named(&m.to_string()).unwrap(), *m);
            assert!(m.mode.is_none_or(|x| m.entry.modes.contains(&x)));
        }
        names.sort();
        names.dedup();
        assert_eq!(names.len(), listed.len());
        for e in METHODS {
            assert!(!e.modes.is_empty(), "{}", e.name);
            for &m in e.modes {
                let label = Method::label_for(e, m);
                let parsed = Method::named(&label).unwrap();
                assert!(std::ptr::eq(parsed.entry, *e), "{label}");
            }
        }
        // Underscores read as dashes (vLLM's spelling); the old method names still parse.
        for (name, mode) in [
            ("dflash_tree", Some(Mode::Tree)),
            ("pard-sample", Some(Mode::Sample)),
            ("diffuspec-raw", Some(Mode::Greedy)),
            ("dart", None),
        ] {
            assert_eq!(Method::named(name).unwrap().mode, mode, "{name}");
        }
        let e = Method::named("dflash-beam").unwrap_err().to_string();
        assert!(
            e.contains("unknown drafter") && e.contains("dflash-tree"),
            "{e}"
        );
        assert!(Method::named("none").unwrap().is_none());
    }

    /// The configuration: modes resolve per method, unused options are refused naming who
    /// reads them, the older JSON keys map onto the new ones.
    #[test]
    fn modes_options_and_older_keys() {
        let m = |s: &str| Method::named(s).unwrap();
        let cfg = DrafterConfig {
            drafting: Some(Mode::Tree),
            ..Default::default()
        };
        assert_eq!(cfg.mode_of(m("dflash")), Mode::Tree);
        assert_eq!(cfg.mode_of(m("dflash-sample")), Mode::Sample);
        assert_eq!(
            cfg.mode_of(m("diffuspec")),
            Mode::Cps,
            "diffuspec draws no tree"
        );
        assert!(cfg.check_used(&[m("pard"), m("pld")]).is_ok());
        let e = cfg.check_used(&[m("pld")]).unwrap_err().to_string();
        assert!(e.contains("--drafting tree has no effect with pld"), "{e}");
        let no_cps = DrafterConfig {
            drafting: Some(Mode::Greedy),
            ..Default::default()
        };
        let e = no_cps.check_used(&[m("pard")]).unwrap_err().to_string();
        assert!(e.contains("--no-cps") && e.contains("diffuspec"), "{e}");
        let arpa = DrafterConfig {
            ngram_arpa: Some("x.arpa".into()),
            ..no_cps.clone()
        };
        let e = arpa.check_used(&[m("diffuspec")]).unwrap_err().to_string();
        assert!(
            e.contains("--ngram-arpa has no effect with diffuspec --no-cps"),
            "{e}"
        );
        assert!(DrafterConfig {
            drafting: None,
            ..arpa
        }
        .check_used(&[m("diffuspec")])
        .is_ok());
        let base = DrafterConfig::default();
        let c = base
            .with_json(r#"{"method": "dflash", "cps": true, "fixed_draft": true}"#)
            .unwrap();
        assert_eq!(c.drafting, Some(Mode::Cps));
        assert_eq!(
            c.draft_length,
            super::super::speculative_config::DraftLength::Fixed
        );
        assert_eq!(c.label(), "dflash-cps");
        let c = base
            .with_json(r#"{"method": "diffuspec", "no_cps": true}"#)
            .unwrap();
        assert_eq!(c.label(), "diffuspec-raw");
        for bad in [
            r#"{"method": "dflash", "cps": true, "drafting": "tree"}"#,
            r#"{"method": "dflash", "cps": 1}"#,
            r#"{"method": "dflash", "drafting": "wide"}"#,
            r#"{"method": "dflash", "speed": 2}"#,
        ] {
            assert!(base.with_json(bad).is_err(), "{bad}");
        }
    }
}
