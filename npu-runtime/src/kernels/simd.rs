//! Run-time instruction-set selection. Every kernel has one implementation per
//! [`Isa`]; all of them compute the same canonical sequence of integer and f32
//! operations, so results are bit-identical across ISAs (tests check this).

use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// AVX-512 F/BW/VL + VNNI (`vpdpbusd`) + F16C/FMA.
    Avx512Vnni,
    /// AVX2 + FMA + F16C + AVX-VNNI (VEX `vpdpbusd` on 256 bits: Intel Alder Lake and
    /// later without AVX-512, AMD Zen 4/5): the AVX2 kernels with one dot-product
    /// instruction where AVX2 needs `vpmaddubsw` + `vpmaddwd` + `vpaddd`.
    AvxVnni,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// Plain Rust, any target.
    Portable,
}

impl Isa {
    /// Whether this CPU can run kernels for `self`.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => Isa::Avx2.is_supported() && is_x86_feature_detected!("avxvnni"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                Isa::Avx2.is_supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every ISA this CPU supports, best first.
    pub fn available() -> Vec<Isa> {
        [Isa::Avx512Vnni, Isa::AvxVnni, Isa::Avx2, Isa::Portable]
            .into_iter()
            .filter(|i| i.is_supported())
            .collect()
    }

    /// The `RAG_ISA` spelling of this ISA.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512Vnni => "avx512",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }

    fn parse(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "portable" | "scalar" => Some(Isa::Portable),
            "avx2" => Some(Isa::Avx2),
            "avxvnni" | "avx-vnni" => Some(Isa::AvxVnni),
            "avx512" | "avx512vnni" => Some(Isa::Avx512Vnni),
            _ => None,
        }
    }
}

/// The ISA kernels use by default: the best one this CPU supports, unless the
/// environment variable `RAG_ISA` (`portable`, `avx2`, `avxvnni`, `avx512`) asks for
/// another supported one. Decided once per process.
pub fn detected() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let best = Isa::available()[0];
        match std::env::var("RAG_ISA").ok().as_deref().map(Isa::parse) {
            Some(Some(isa)) if isa.is_supported() => isa,
            Some(_) => {
                tracing::warn!("RAG_ISA is unknown or unsupported here; using {best:?}");
                best
            }
            None => best,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portable_always_available_and_detected_is_supported() {
        assert!(Isa::available().contains(&Isa::Portable));
        assert!(detected().is_supported());
        assert_eq!(Isa::parse("AVX512"), Some(Isa::Avx512Vnni));
        assert_eq!(Isa::parse("avx-vnni"), Some(Isa::AvxVnni));
        for isa in [Isa::Avx512Vnni, Isa::AvxVnni, Isa::Avx2, Isa::Portable] {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        // AVX-VNNI implies the AVX2 tier.
        assert!(!Isa::AvxVnni.is_supported() || Isa::Avx2.is_supported());
        assert_eq!(Isa::parse("nope"), None);
    }
}
