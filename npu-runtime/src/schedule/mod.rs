//! Graph-switch scheduling for prefill. The planning (profiles, planners, simulator, exact
//! solver, layout choice) is the `npu-schedule` crate, re-exported here; this module adds
//! what runs a plan on a real backend: [`exec`] (compute on the calling thread, switches
//! on a loader thread; `session::Session`'s graphs implement its executor trait) and
//! [`warmup`] (profiling through the same trait).

pub use npu_schedule::*;

pub mod exec;
pub mod warmup;

/// A stable identity of this machine as the kernels see it: CPU model name, logical CPU
/// count and the kernels' instruction set (`RAG_ISA` changes every timing).
pub fn machine_id() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    format!(
        "{model} x{cpus} {}",
        crate::kernels::simd::detected().name()
    )
}

/// The machine a warm-up profile of `backend` describes, as profile files name it: the CPU
/// backend's costs depend on the compute threads; the HTP's do not (on x86-64 the HTP is
/// the QNN emulator, so the host still matters).
pub fn profile_machine(backend: &str, threads: usize) -> String {
    match backend {
        "cpu" => format!("{} ({threads} threads)", machine_id()),
        _ if cfg!(target_arch = "x86_64") => format!("{} (emulated HTP)", machine_id()),
        _ => format!("{} (HTP)", machine_id()),
    }
}
