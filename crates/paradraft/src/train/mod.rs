//! Drafter training: self-distillation data, cached target features, shared optimisation
//! pieces and the per-method training loops (DFlash first; the data, feature and optimiser
//! stages are meant for the drafters that follow).

pub mod bf16;
pub mod campaign;
pub mod dart;
pub mod data;
pub mod dflash;
pub mod dlm;
pub mod export;
pub mod features;
pub mod fused;
pub mod graph;
pub mod optim;
pub mod pard;
pub mod pipeline;
pub mod plot;
pub mod run;
