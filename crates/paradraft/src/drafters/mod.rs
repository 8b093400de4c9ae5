//! Drafters, one module per method. Baselines: prompt lookup ([`pld`]) and replayed trees
//! ([`replay`], for tests).

pub mod draft_model;
pub mod pld;
pub mod replay;
