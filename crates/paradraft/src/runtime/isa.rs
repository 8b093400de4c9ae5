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
    /// AVX-512 VNNI plus Intel AMX-INT8 (Sapphire Rapids and later, where the OS grants the
    /// tile data): Q4 / Q8 matmuls of 16 to 64 activation rows on 16 × 16 int32 tiles,
    /// everything else as `avx512`.
    Amx,
    /// ARM (AArch64) NEON with the dot-product extension (`sdot`, Armv8.2 DotProd): the int8
    /// matmul and activation quantization; the other operations run the portable code.
    NeonDot,
}

impl Isa {
    /// Every family: the x86 chain in order, then the ARM one.
    pub const ALL: [Isa; 6] = [
        Isa::Portable,
        Isa::Avx2,
        Isa::AvxVnni,
        Isa::Avx512Vnni,
        Isa::Amx,
        Isa::NeonDot,
    ];

    /// The name `PARADRAFT_ISA` takes.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512Vnni => "avx512",
            Isa::Amx => "amx",
            Isa::NeonDot => "neon",
        }
    }

    /// Position in the x86 chain (`None` for the ARM family and the portable code).
    fn x86_rank(self) -> Option<u8> {
        match self {
            Isa::Avx2 => Some(1),
            Isa::AvxVnni => Some(2),
            Isa::Avx512Vnni => Some(3),
            Isa::Amx => Some(4),
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
        let (isa, notice) = with_tiles(amx_int8(), amx_enabled(), amx_granted);
        if let Some(n) = notice {
            eprintln!("paradraft: {n}");
        }
        isa
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

/// An AVX-512 VNNI CPU's family given what it says of its tiles: `amx` when it has AMX-INT8
/// (`cpu`), the OS enables the tile state (`os`, XCR0) and grants it to this process
/// (`grant`, asked only then); else `avx512`, with a one-line notice when the CPU has the
/// tiles but may not use them.
#[cfg(target_arch = "x86_64")]
fn with_tiles(cpu: bool, os: bool, grant: impl FnOnce() -> bool) -> (Isa, Option<String>) {
    let denied = |why: &str| {
        let n = format!("this CPU has AMX-INT8 tiles but {why}: using the avx512 kernels");
        (Isa::Avx512Vnni, Some(n))
    };
    match (cpu, os) {
        (false, _) => (Isa::Avx512Vnni, None),
        (true, false) => denied("the OS (or hypervisor) does not enable their state (XCR0)"),
        (true, true) if grant() => (Isa::Amx, None),
        (true, true) => denied("the OS refused this process their data (ARCH_REQ_XCOMP_PERM)"),
    }
}

/// Whether this process may run AMX-INT8 tile code: the CPU has the tiles, the OS enables
/// their state and grants this process their data (asking for it, as kernel detection does).
#[cfg(target_arch = "x86_64")]
pub fn tiles_usable() -> bool {
    amx_int8() && amx_enabled() && amx_granted()
}

/// Whether the CPU has AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24 and 25) with the
/// palette the kernels use (leaf 0x1D: 8 tiles of 16 rows × 64 bytes).
#[cfg(target_arch = "x86_64")]
fn amx_int8() -> bool {
    use std::arch::x86_64::__cpuid_count;
    // Leaves above the maximum would repeat the highest one's values.
    if __cpuid_count(0, 0).eax < 0x1D || __cpuid_count(7, 0).edx & (3 << 24) != 3 << 24 {
        return false;
    }
    // Palette 1 (leaf 0x1D sub-leaf 1): EAX[31:16] bytes per tile, EBX[15:0] bytes per row,
    // EBX[31:16] tile names, ECX[15:0] rows.
    let p = __cpuid_count(0x1D, 1);
    let (bytes_per_tile, names) = (p.eax >> 16, p.ebx >> 16);
    let (bytes_per_row, max_rows) = (p.ebx & 0xFFFF, p.ecx & 0xFFFF);
    bytes_per_tile >= 1024 && names >= 8 && bytes_per_row >= 64 && max_rows >= 16
}

/// Whether the OS has enabled the tile state: XCR0 bits 17 (TILECFG) and 18 (TILEDATA), read
/// only where CPUID says the OS uses XSAVE (leaf 1, ECX bit 27).
#[cfg(target_arch = "x86_64")]
fn amx_enabled() -> bool {
    use std::arch::x86_64::__cpuid_count;
    if __cpuid_count(1, 0).ecx & (1 << 27) == 0 {
        return false;
    }
    let (lo, hi): (u32, u32);
    // SAFETY: XGETBV with ECX = 0 is defined wherever OSXSAVE is set (checked above).
    unsafe {
        std::arch::asm!(
            "xgetbv",
            in("ecx") 0u32,
            out("eax") lo,
            out("edx") hi,
            options(nomem, nostack)
        );
    }
    let xcr0 = (hi as u64) << 32 | lo as u64;
    xcr0 & (3 << 17) == 3 << 17
}

/// Whether the OS lets this process use the tile data: Linux asks each process to request it
/// once (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, for all its threads);
/// elsewhere the tiles are not used.
#[cfg(target_arch = "x86_64")]
fn amx_granted() -> bool {
    #[cfg(target_os = "linux")]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a plain system call with integer arguments; failure is a return value.
        unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            ) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
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
            ("amx-int8", amx_int8()),
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
            assert_eq!(choose(Some(i.name()), false, Isa::Amx), Ok(i));
        }
        // AMX needs its tiles: an AVX-512 CPU without them refuses it, and one with them
        // can be held to AVX-512.
        assert!(choose(Some("amx"), false, Isa::Avx512Vnni).is_err());
        assert_eq!(choose(Some("avx512"), false, Isa::Amx), Ok(Isa::Avx512Vnni));
        assert!(Isa::Amx.has_x86(Isa::Avx512Vnni) && !Isa::Avx512Vnni.has_x86(Isa::Amx));
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
        // Tiles the CPU has but the OS keeps from this process: AVX-512, said in one line.
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            with_tiles(false, true, || panic!("not asked")),
            (Isa::Avx512Vnni, None)
        );
        #[cfg(target_arch = "x86_64")]
        assert_eq!(with_tiles(true, true, || true), (Isa::Amx, None));
        #[cfg(target_arch = "x86_64")]
        for (os, grant) in [(false, true), (true, false)] {
            let (isa, notice) = with_tiles(true, os, || grant);
            let notice = notice.expect("a notice");
            assert_eq!(isa, Isa::Avx512Vnni);
            assert!(
                notice.contains("avx512") && !notice.contains('\n'),
                "{notice}"
            );
        }
        let unknown = choose(Some("sse"), false, Isa::Avx2).unwrap_err();
        assert!(
            unknown.contains("portable, avx2, avxvnni, avx512, amx, neon"),
            "{unknown}"
        );
    }
}
