//! The threaded executor against a mock backend that checks residency: it fails if a step
//! runs on a form that is not resident, or if a block computes while it is switching.

use npu_runtime::schedule::exec::{execute, ScheduleExecutor};
use npu_runtime::schedule::warmup::{warmup_profile, WarmupConfig};
use npu_runtime::schedule::{
    Form, Instance, MemoryBudget, Plan, Result, ScheduleError, ScheduleKind,
};
use std::sync::Mutex;
use std::time::Duration;

/// Loads from `(block, release)` pairs.
fn load_list(pairs: &[(usize, usize)]) -> Vec<npu_runtime::schedule::Load> {
    pairs
        .iter()
        .map(|&(block, release)| npu_runtime::schedule::Load { block, release })
        .collect()
}

#[derive(Default, Clone, Copy)]
struct BlockState {
    g1: bool,
    g2: bool,
    busy: bool,
}

struct Mock {
    blocks: Mutex<Vec<BlockState>>,
    /// Sleep per call, to let the threads really interleave.
    pause: Duration,
    fail_load_of: Option<usize>,
    /// Both forms may be resident: G1 compute during the block's own load is allowed.
    double: bool,
    log: Mutex<Vec<String>>,
}

impl Mock {
    fn new(n: usize, pause_us: u64) -> Mock {
        Mock {
            blocks: Mutex::new(vec![
                BlockState {
                    g1: true,
                    g2: false,
                    busy: false
                };
                n
            ]),
            pause: Duration::from_micros(pause_us),
            fail_load_of: None,
            double: false,
            log: Mutex::new(Vec::new()),
        }
    }
    fn err(m: String) -> ScheduleError {
        ScheduleError::Executor(m)
    }
}

impl ScheduleExecutor for Mock {
    fn begin_prefill(&self) -> Result<()> {
        Ok(())
    }
    fn compute(&self, block: usize, chunk: usize, form: Form) -> Result<()> {
        {
            let mut b = self.blocks.lock().unwrap();
            let s = &mut b[block];
            let resident = if form == Form::G1 { s.g1 } else { s.g2 };
            let conflict = s.busy && !(self.double && form == Form::G1);
            if !resident || conflict {
                return Err(Mock::err(format!(
                    "compute of block {block} on {form:?}: resident {resident}, switching {}",
                    s.busy
                )));
            }
        }
        self.log
            .lock()
            .unwrap()
            .push(format!("c{block}.{chunk}{form:?}"));
        std::thread::sleep(self.pause);
        Ok(())
    }
    fn load(&self, block: usize, form: Form) -> Result<()> {
        if self.fail_load_of == Some(block) {
            return Err(Mock::err(format!("load of block {block} failed")));
        }
        self.blocks.lock().unwrap()[block].busy = true;
        std::thread::sleep(self.pause * 2);
        let mut b = self.blocks.lock().unwrap();
        b[block].busy = false;
        match form {
            Form::G1 => b[block].g1 = true,
            Form::G2 => b[block].g2 = true,
        }
        Ok(())
    }
    fn unload(&self, block: usize, form: Form) -> Result<()> {
        let mut b = self.blocks.lock().unwrap();
        match form {
            Form::G1 => b[block].g1 = false,
            Form::G2 => b[block].g2 = false,
        }
        Ok(())
    }
    fn decode(&self) -> Result<()> {
        let b = self.blocks.lock().unwrap();
        if b.iter().all(|s| s.g2) {
            Ok(())
        } else {
            Err(Mock::err("decode before every block is on G2".into()))
        }
    }
    fn form_bytes(&self, _block: usize, form: Form) -> u64 {
        if form == Form::G1 {
            100
        } else {
            40
        }
    }
}

#[test]
fn every_schedule_respects_residency_on_real_threads() {
    let (n, c) = (4, 3);
    let inst = Instance::uniform(n, c, 10, 12, 15, 1, 5);
    for kind in ScheduleKind::ALL {
        let plan = kind.plan(&inst).unwrap();
        let mock = Mock::new(n, 300);
        let rep = execute(&mock, n, c, &plan, false).unwrap();
        assert_eq!(rep.forms.len(), n * c);
        assert!(rep.prefill_end > 0 && rep.ttft >= rep.prefill_end.max(rep.switch_end));
        let rel = plan.release_of(n);
        for (s, f) in rep.forms.iter().enumerate() {
            assert_eq!(*f == Form::G2, rel[s % n] <= s, "{} step {s}", kind.name());
        }
        assert_eq!(mock.log.lock().unwrap().len(), n * c);
        let m = rep.metrics(1);
        assert!(m.ttft_ms > 0.0 && m.stall_ms >= 0.0);
    }
}

#[test]
fn double_residency_keeps_computing_on_g1_while_g2_loads() {
    let (n, c) = (2, 2);
    // Both switches released at step 0. With both forms resident the mock allows G1
    // compute during the block's own load (never G2 before it is loaded).
    let plan = Plan {
        loads: load_list(&[(0, 0), (1, 0)]),
    };
    let mut mock = Mock::new(n, 2000);
    mock.double = true;
    let rep = execute(&mock, n, c, &plan, true).unwrap();
    assert_eq!(mock.log.lock().unwrap().len(), n * c);
    // G1 forms are released after the decode step.
    assert!(mock.blocks.lock().unwrap().iter().all(|s| !s.g1 && s.g2));
    assert!(rep.ttft >= rep.switch_end);
    // The same plan with one form per block makes block 0 wait for its switch.
    let mock = Mock::new(n, 200);
    let rep = execute(&mock, n, c, &plan, false).unwrap();
    assert_eq!(rep.forms, vec![Form::G2; n * c]);
}

#[test]
fn a_failing_load_aborts_without_deadlock() {
    let (n, c) = (3, 2);
    let inst = Instance::uniform(n, c, 10, 12, 15, 1, 5);
    let plan = ScheduleKind::Progressive.plan(&inst).unwrap();
    let mut mock = Mock::new(n, 200);
    mock.fail_load_of = Some(plan.loads[0].block);
    let err = execute(&mock, n, c, &plan, false).unwrap_err().to_string();
    assert!(err.contains("failed") || err.contains("aborted"), "{err}");
}

#[test]
fn invalid_plans_are_refused_before_running() {
    let mock = Mock::new(2, 0);
    let plan = Plan {
        loads: load_list(&[(0, 9), (1, 9)]),
    };
    assert!(execute(&mock, 2, 2, &plan, false).is_err());
    assert!(mock.log.lock().unwrap().is_empty());
}

#[test]
fn warmup_profiles_every_block_and_restores_g1() {
    let n = 3;
    let mock = Mock::new(n, 500);
    let cfg = WarmupConfig {
        model: "mock".into(),
        backend: "mock".into(),
        machine: "test".into(),
        chunk_tokens: 64,
        g2_tokens: 16,
        layers: (0..n).map(|b| format!("{b}")).collect(),
        reps: 2,
        switch_needed: true,
    };
    let p = warmup_profile(&mock, &cfg).unwrap();
    assert_eq!(p.n_blocks(), n);
    for b in &p.blocks {
        // Sleeps are lower bounds: compute >= 0.5 ms, load >= 1 ms.
        assert!(
            b.g1_chunk_ms >= 0.5 && b.g2_chunk_ms >= 0.5 && b.load_g2_ms >= 1.0,
            "{b:?}"
        );
        assert_eq!((b.mem_g1_bytes, b.mem_g2_bytes), (100, 40));
    }
    assert!(mock.blocks.lock().unwrap().iter().all(|s| s.g1 && !s.g2));
    // The profile round-trips through JSON and drives the simulator.
    let q = npu_runtime::schedule::Profile::from_json(&p.to_json()).unwrap();
    assert_eq!(
        (q.n_blocks(), &q.model, q.chunk_tokens),
        (p.n_blocks(), &p.model, p.chunk_tokens)
    );
    for (a, b) in p.blocks.iter().zip(&q.blocks) {
        for (x, y) in [
            (a.g1_chunk_ms, b.g1_chunk_ms),
            (a.g2_chunk_ms, b.g2_chunk_ms),
            (a.load_g2_ms, b.load_g2_ms),
        ] {
            assert!((x - y).abs() <= 1e-9 * x.abs().max(1.0), "{x} vs {y}");
        }
    }
    Instance::from_profile(&q, 200, MemoryBudget::OneFormPerBlock).unwrap();
    let bad = WarmupConfig { reps: 0, ..cfg };
    assert!(warmup_profile(&mock, &bad).is_err());
}
