//! Which kernel family the CPU runs: detected once at first use; `PARADRAFT_ISA` picks one
//! the CPU has (for comparisons and tests), and naming one it lacks is an error that lists the
//! CPU's features, never an illegal instruction.

use std::sync::OnceLock;

/// The kernel families. The x86 ones form a chain, each needing everything the ones before it
/// need; NEON is the ARM one. [`Isa::runs_on`] says which a CPU can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Scalar Rust (any CPU).
    Portable,
    /// AVX2 + FMA + F16C: `maddubs` int8 kernels, 8-lane attention.
    Avx2,
    /// 256-bit VNNI (`vpdpbusd` on 8-lane registers): Intel AVX-VNNI (Alder Lake and later,
    /// VEX encoding), or AVX-512 VNNI with VL (EVEX encoding) on CPUs that have that instead.
    AvxVnni,
    /// AVX-512 F/BW/VNNI: 16-lane kernels.
    Avx512Vnni,
    /// ARM (AArch64) NEON with the dot-product extension (`sdot`, Armv8.2 DotProd): the int8
    /// matmul and activation quantization; the other operations run the portable code.
    NeonDot,
}

impl Isa {
    /// Every family: the x86 chain in order, then the ARM one.
    pub const ALL: [Isa; 5] = [
        Isa::Portable,
        Isa::Avx2,
        Isa::AvxVnni,
        Isa::Avx512Vnni,
        Isa::NeonDot,
    ];

    /// The name `PARADRAFT_ISA` takes.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512Vnni => "avx512",
            Isa::NeonDot => "neon",
        }
    }

    /// Position in the x86 chain (`None` for the ARM family and the portable code).
    fn x86_rank(self) -> Option<u8> {
        match self {
            Isa::Avx2 => Some(1),
            Isa::AvxVnni => Some(2),
            Isa::Avx512Vnni => Some(3),
            Isa::Portable | Isa::NeonDot => None,
        }
    }

    /// Whether a CPU whose best family is `best` runs this one: the portable code runs
    /// anywhere, an x86 family wherever a family at or above it in the chain does, NEON only
    /// where NEON is the best.
    pub fn runs_on(self, best: Isa) -> bool {
        match (self.x86_rank(), best.x86_rank()) {
            _ if self == Isa::Portable || self == best => true,
            (Some(a), Some(b)) => a <= b,
            _ => false,
        }
    }

    /// Whether this family has the x86 family `floor` (x86 families only).
    pub fn has_x86(self, floor: Isa) -> bool {
        floor.x86_rank().is_some() && floor.runs_on(self)
    }

    fn parse(s: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name() == s)
    }
}

/// The family the kernels use: [`selected`], or the best the CPU has when `PARADRAFT_ISA` is
/// not valid (the CLI and [`crate::model::load`] refuse that case before any forward).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| selected().unwrap_or_else(|_| detect()))
}

/// The family `PARADRAFT_ISA` names (`PARADRAFT_PORTABLE=1` means `portable`), else the best
/// the CPU has; an unknown name or one the CPU lacks is an error saying what it has.
pub fn selected() -> Result<Isa, String> {
    let want = std::env::var("PARADRAFT_ISA").ok();
    let portable = std::env::var_os("PARADRAFT_PORTABLE").is_some();
    choose(want.as_deref(), portable, detect())
}

/// [`selected`] for given settings and best family.
fn choose(want: Option<&str>, portable: bool, best: Isa) -> Result<Isa, String> {
    let want = match want {
        Some(v) => Isa::parse(v).ok_or_else(|| {
            let names: Vec<_> = Isa::ALL.iter().map(|i| i.name()).collect();
            format!("PARADRAFT_ISA={v:?}: want one of {}", names.join(", "))
        })?,
        None if portable => Isa::Portable,
        None => return Ok(best),
    };
    if !want.runs_on(best) {
        return Err(format!(
            "PARADRAFT_ISA={}: this CPU lacks it; it has {} (best kernel family: {})",
            want.name(),
            cpu_features(),
            best.name()
        ));
    }
    Ok(want)
}

/// The best family this CPU runs.
pub fn detect() -> Isa {
    static BEST: OnceLock<Isa> = OnceLock::new();
    *BEST.get_or_init(detect_uncached)
}

#[cfg(target_arch = "x86_64")]
fn detect_uncached() -> Isa {
    use std::arch::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma") && has!("f16c");
    if avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
        Isa::Avx512Vnni
    } else if avx2 && (has!("avxvnni") || (has!("avx512vnni") && has!("avx512vl"))) {
        Isa::AvxVnni
    } else if avx2 {
        Isa::Avx2
    } else {
        Isa::Portable
    }
}

#[cfg(target_arch = "aarch64")]
fn detect_uncached() -> Isa {
    if std::arch::is_aarch64_feature_detected!("dotprod") {
        Isa::NeonDot
    } else {
        Isa::Portable
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect_uncached() -> Isa {
    Isa::Portable
}

/// Whether the 256-bit VNNI kernels must use the EVEX (AVX-512 VL) encoding: the CPU has
/// AVX-512 VNNI but not the VEX-encoded AVX-VNNI.
#[cfg(target_arch = "x86_64")]
pub(crate) fn vnni_evex() -> bool {
    static EVEX: OnceLock<bool> = OnceLock::new();
    *EVEX.get_or_init(|| !std::arch::is_x86_feature_detected!("avxvnni"))
}

/// The SIMD features the kernels care about that this CPU has, e.g. `avx2 fma f16c`.
pub fn cpu_features() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let all = [
            ("sse4.2", has!("sse4.2")),
            ("avx", has!("avx")),
            ("avx2", has!("avx2")),
            ("fma", has!("fma")),
            ("f16c", has!("f16c")),
            ("avxvnni", has!("avxvnni")),
            ("avx512f", has!("avx512f")),
            ("avx512bw", has!("avx512bw")),
            ("avx512vl", has!("avx512vl")),
            ("avx512vnni", has!("avx512vnni")),
            ("avx512bf16", has!("avx512bf16")),
        ];
        let on: Vec<_> = all.iter().filter(|f| f.1).map(|f| f.0).collect();
        if on.is_empty() {
            "no SIMD extension the kernels use".into()
        } else {
            on.join(" ")
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        use std::arch::is_aarch64_feature_detected as has;
        let all = [
            ("neon", has!("neon")),
            ("dotprod", has!("dotprod")),
            ("fp16", has!("fp16")),
            ("i8mm", has!("i8mm")),
        ];
        let on: Vec<_> = all.iter().filter(|f| f.1).map(|f| f.0).collect();
        format!("aarch64 {}", on.join(" "))
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        format!("{} (portable kernels only)", std::env::consts::ARCH)
    }
}

/// The CPU's model name (`/proc/cpuinfo` on Linux), if the OS says it.
pub fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

/// What tells this machine's CPU and kernels apart from another's, for the names of what is
/// measured once and kept (the sizer's cost curves and speed guards): the model name, family
/// and model numbers (`/proc/cpuinfo`; every EPYC VM here says only "AMD EPYC"), and the
/// kernel family in use.
pub fn cpu_signature() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.split(':').next().map(str::trim) == Some(name))
            .and_then(|l| l.split_once(':'))
            .map_or("", |(_, v)| v.trim())
    };
    format!(
        "{}|{}|{}|{}",
        field("model name"),
        field("cpu family"),
        field("model"),
        isa().name()
    )
}

/// One line for logs and benchmark headers: the family in use and the CPU's features.
pub fn describe() -> String {
    format!("kernels {} (CPU: {})", isa().name(), cpu_features())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_pick_a_family_the_cpu_has_or_say_what_it_has() {
        assert_eq!(choose(None, false, Isa::Avx2), Ok(Isa::Avx2));
        assert_eq!(choose(None, true, Isa::Avx2), Ok(Isa::Portable));
        assert_eq!(choose(Some("avx2"), true, Isa::Avx512Vnni), Ok(Isa::Avx2));
        for i in Isa::ALL.into_iter().filter(|&i| i != Isa::NeonDot) {
            assert_eq!(choose(Some(i.name()), false, Isa::Avx512Vnni), Ok(i));
        }
        // The ARM and x86 families never stand in for each other.
        assert!(choose(Some("neon"), false, Isa::Avx512Vnni).is_err());
        assert!(choose(Some("avx2"), false, Isa::NeonDot).is_err());
        assert_eq!(choose(Some("neon"), false, Isa::NeonDot), Ok(Isa::NeonDot));
        assert_eq!(
            choose(Some("portable"), false, Isa::NeonDot),
            Ok(Isa::Portable)
        );
        assert!(Isa::Avx512Vnni.has_x86(Isa::Avx2) && !Isa::Avx2.has_x86(Isa::AvxVnni));
        assert!(!Isa::NeonDot.has_x86(Isa::Avx2) && !Isa::Portable.has_x86(Isa::Avx2));
        let lacks = choose(Some("avx512"), false, Isa::Avx2).unwrap_err();
        assert!(
            lacks.contains("lacks") && lacks.contains("best kernel family: avx2"),
            "{lacks}"
        );
        assert!(lacks.contains(&cpu_features()), "{lacks}");
        let unknown = choose(Some("sse"), false, Isa::Avx2).unwrap_err();
        assert!(
            unknown.contains("portable, avx2, avxvnni, avx512, neon"),
            "{unknown}"
        );
    }
}
