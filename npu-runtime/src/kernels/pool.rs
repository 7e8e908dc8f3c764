//! A persistent thread pool for data-parallel kernels.
//!
//! Workers live as long as the pool. Between jobs they spin briefly (a decode
//! step issues ~170 matmuls back to back, and waking a parked thread costs
//! tens of microseconds), then park on a condition variable. The calling thread
//! takes tasks too. Each thread starts on its own contiguous share of the tasks and
//! then takes halves of the others' remaining shares (`Job::run_tasks`), so which
//! thread runs which task varies; callers must make every task write disjoint
//! outputs so results do not depend on it.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(300);

thread_local! {
    /// Set while this thread runs pool tasks: nested `parallel_for` calls run inline.
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

type TaskFn<'a> = dyn Fn(usize) + Sync + 'a;

/// One `parallel_for` call, living on the caller's stack.
struct Job<'a> {
    f: &'a TaskFn<'a>,
    /// Per thread (0: the caller, `i`: worker `i`) the tasks `[front, back)` it still
    /// owns, packed by [`pack`].
    ranges: &'a [Range],
    in_order: bool,
    panicked: AtomicBool,
}

/// One thread's task range, alone in its cache lines: every task taken is a CAS on it, and
/// with the ranges packed side by side each CAS took the line from the other thread
/// (benchmarks/runs/kernels-worklog.md#item-72).
#[repr(align(128))]
struct Range(AtomicU64);

fn pack(front: usize, back: usize) -> u64 {
    ((front as u64) << 32) | back as u64
}

fn unpack(r: u64) -> (usize, usize) {
    ((r >> 32) as usize, (r & 0xFFFF_FFFF) as usize)
}

impl Job<'_> {
    /// Thread `me` runs its own tasks in ascending order, then repeatedly takes the back
    /// half of another thread's remaining tasks as its own. So each thread walks a
    /// contiguous run of tasks: for a matmul, one stream of adjacent row groups whose
    /// software prefetch runs on from one task into the next, instead of tasks dealt
    /// out alternately (each starting cold, its predecessor's prefetch spent on a range
    /// the other thread reads). A late or descheduled thread's tasks are still taken.
    fn run_tasks(&self, me: usize) {
        // In order (`parallel_for_in_order`): thread 0's range holds every task and all
        // threads take its front.
        let own = if self.in_order {
            &self.ranges[0].0
        } else {
            &self.ranges[me].0
        };
        loop {
            while let Some(i) = self.take_front(own) {
                if catch_unwind(AssertUnwindSafe(|| (self.f)(i))).is_err() {
                    self.panicked.store(true, Ordering::Relaxed);
                }
            }
            if self.in_order {
                return;
            }
            let n = self.ranges.len();
            let Some((lo, hi)) = (1..n).find_map(|k| self.steal_half(&self.ranges[(me + k) % n].0))
            else {
                return;
            };
            // Only this thread adds to its own range, and it is empty: nobody changes it
            // meanwhile (others' attempts on an empty range do nothing).
            own.store(pack(lo, hi), Ordering::SeqCst);
        }
    }

    fn take_front(&self, r: &AtomicU64) -> Option<usize> {
        let mut cur = r.load(Ordering::SeqCst);
        loop {
            let (f, b) = unpack(cur);
            if f >= b {
                return None;
            }
            match r.compare_exchange_weak(cur, pack(f + 1, b), Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Some(f),
                Err(v) => cur = v,
            }
        }
    }

    /// Removes the back half (at least one task) of `r`'s remaining tasks and returns it.
    fn steal_half(&self, r: &AtomicU64) -> Option<(usize, usize)> {
        let mut cur = r.load(Ordering::SeqCst);
        loop {
            let (f, b) = unpack(cur);
            if f >= b {
                return None;
            }
            let mid = f + (b - f) / 2;
            match r.compare_exchange_weak(cur, pack(f, mid), Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Some((mid, b)),
                Err(v) => cur = v,
            }
        }
    }
}

/// `state` bit: a job is published and may be joined.
const OPEN: usize = 1 << (usize::BITS - 1);

struct Shared {
    /// Bumped once per job so idle workers notice it.
    epoch: AtomicU64,
    /// `OPEN` flag | number of workers currently inside the published job.
    /// Workers join only while `OPEN`; the caller clears `OPEN` when it has
    /// finished its own share and then waits only for workers that joined, so
    /// a worker that is descheduled (busy machine) never delays a call.
    state: AtomicUsize,
    job: AtomicPtr<Job<'static>>,
    /// Each thread's task range for the current job ([`Job::ranges`]).
    ranges: Box<[Range]>,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises `parallel_for` calls from different threads.
    call: Mutex<()>,
}

impl ThreadPool {
    /// A pool of `n_threads` threads in total, counting the caller
    /// (so `n_threads - 1` workers; 0 is treated as 1).
    pub fn new(n_threads: usize) -> Self {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            state: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            ranges: (0..n_threads.max(1))
                .map(|_| Range(AtomicU64::new(0)))
                .collect(),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..n_threads.max(1))
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("kernel-worker-{i}"))
                    .spawn(move || worker(&s, i))
                    .expect("spawning a kernel worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            call: Mutex::new(()),
        }
    }

    /// A pool sized to the machine (`available_parallelism`).
    pub fn with_available_parallelism() -> Self {
        Self::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Run `f(0) .. f(n_tasks - 1)` across the pool and return when all are done: each
    /// thread a contiguous share, then halves of the others' (`Job::run_tasks`).
    /// A panic in a task is re-raised here after every task has finished.
    pub fn parallel_for(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        self.run(n_tasks, f, false)
    }

    /// [`Self::parallel_for`] with the tasks started in index order, each by the next
    /// free thread: for tasks of unequal size sorted largest first (loading a model:
    /// the vocabulary matrix, then the layers, each freeing its source pages when done).
    pub fn parallel_for_in_order(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        self.run(n_tasks, f, true)
    }

    fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync), in_order: bool) {
        if n_tasks == 0 {
            return;
        }
        if self.workers.is_empty() || n_tasks == 1 || IN_POOL.with(|c| c.get()) {
            for i in 0..n_tasks {
                f(i);
            }
            return;
        }
        let _serial = self.call.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        assert!(n_tasks <= u32::MAX as usize, "parallel_for: too many tasks");
        let n = s.ranges.len();
        for (t, Range(r)) in s.ranges.iter().enumerate() {
            // In order: every thread takes from the front of the one range.
            let share = match (in_order, t) {
                (true, 0) => pack(0, n_tasks),
                (true, _) => pack(0, 0),
                _ => pack(t * n_tasks / n, (t + 1) * n_tasks / n),
            };
            r.store(share, Ordering::SeqCst);
        }
        let job = Job {
            f,
            ranges: &s.ranges,
            in_order,
            panicked: AtomicBool::new(false),
        };
        // SAFETY: workers dereference the pointer only while they are counted in
        // `state`, which they can enter only while `OPEN` is set. This function
        // clears `OPEN` and then waits for the count to reach 0 before returning
        // (task panics are caught, so it cannot unwind earlier), so `job` and the
        // closure it borrows outlive every use. The lifetime is erased only to
        // store the pointer in the shared slot.
        let ptr = unsafe {
            std::mem::transmute::<*const Job<'_>, *mut Job<'static>>(&job as *const Job<'_>)
        };
        s.job.store(ptr, Ordering::SeqCst);
        s.state.store(OPEN, Ordering::SeqCst);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        IN_POOL.with(|c| c.set(true));
        job.run_tasks(0);
        IN_POOL.with(|c| c.set(false));
        s.state.fetch_and(!OPEN, Ordering::SeqCst);
        let mut spins = 0u32;
        while s.state.load(Ordering::SeqCst) != 0 {
            spins += 1;
            if spins < 1 << 16 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        s.job.store(std::ptr::null_mut(), Ordering::SeqCst);
        if job.panicked.load(Ordering::Relaxed) {
            panic!("a ThreadPool task panicked");
        }
    }
}

impl ThreadPool {
    /// Call `f(i, chunk_i)` for the consecutive `chunk`-element pieces of `data` (the last
    /// may be shorter) across the pool. Each piece is handed to exactly one call.
    pub fn for_each_chunk_mut<T: Send>(
        &self,
        data: &mut [T],
        chunk: usize,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        assert!(chunk > 0, "for_each_chunk_mut: chunk must be positive");
        let len = data.len();
        let base = ChunkPtr(data.as_mut_ptr());
        self.parallel_for(len.div_ceil(chunk), &|i| {
            let start = i * chunk;
            let n = chunk.min(len - start);
            // SAFETY: `start + n <= len`, the pieces of different `i` are disjoint and
            // each `i` runs once, and `data` is exclusively borrowed until every task
            // has finished (`parallel_for` returns only then).
            let piece = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), n) };
            f(i, piece);
        });
    }
}

/// A slice base pointer shared by pool tasks that take disjoint pieces.
struct ChunkPtr<T>(*mut T);
// SAFETY: only used by `for_each_chunk_mut`, whose tasks access disjoint pieces of a
// `T: Send` slice.
unsafe impl<T: Send> Sync for ChunkPtr<T> {}
impl<T> ChunkPtr<T> {
    fn get(&self) -> *mut T {
        self.0
    }
}

/// Enter the published job if it is still open.
fn try_join(s: &Shared) -> bool {
    let mut cur = s.state.load(Ordering::SeqCst);
    while cur & OPEN != 0 {
        match s
            .state
            .compare_exchange_weak(cur, cur + 1, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => return true,
            Err(v) => cur = v,
        }
    }
    false
}

fn worker(s: &Shared, me: usize) {
    IN_POOL.with(|c| c.set(true));
    let mut seen = 0u64;
    loop {
        // Wait for a new epoch: spin, then park.
        let start = Instant::now();
        let mut i = 0u32;
        loop {
            if s.epoch.load(Ordering::SeqCst) != seen || s.shutdown.load(Ordering::Acquire) {
                break;
            }
            i = i.wrapping_add(1);
            if i.is_multiple_of(1024) && start.elapsed() > SPIN {
                let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                while s.epoch.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::SeqCst) {
                    g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            std::hint::spin_loop();
        }
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        seen = s.epoch.load(Ordering::SeqCst);
        if try_join(s) {
            let ptr = s.job.load(Ordering::SeqCst);
            // SAFETY: we are counted in `state`, so the caller that published
            // `ptr` is still waiting inside `parallel_for` and the job is alive.
            if let Some(job) = unsafe { ptr.as_ref() } {
                job.run_tasks(me);
            }
            s.state.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_exactly_once() {
        for threads in [1, 2, 3, 4] {
            let pool = ThreadPool::new(threads);
            assert_eq!(pool.n_threads(), threads);
            for n in [0usize, 1, 2, 7, 100] {
                let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                pool.parallel_for(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    /// A task that cannot finish until every other task has run: the others must be
    /// taken from the blocked thread's share (whichever thread holds it), so this fails
    /// (times out) if shares are not stolen.
    #[test]
    fn a_blocked_task_does_not_hold_back_its_threads_share() {
        for threads in [2, 3, 4] {
            let pool = ThreadPool::new(threads);
            let n = 16;
            let done = AtomicUsize::new(0);
            let timed_out = AtomicBool::new(false);
            pool.parallel_for(n, &|i| {
                if i == 0 {
                    let start = Instant::now();
                    while done.load(Ordering::SeqCst) < n - 1 {
                        if start.elapsed() > Duration::from_secs(20) {
                            timed_out.store(true, Ordering::SeqCst);
                            break;
                        }
                        std::hint::spin_loop();
                    }
                } else {
                    done.fetch_add(1, Ordering::SeqCst);
                }
            });
            assert!(!timed_out.load(Ordering::SeqCst), "{threads} threads");
            assert_eq!(done.load(Ordering::SeqCst), n - 1);
        }
    }

    /// In order: a task starts only after every lower task has started.
    #[test]
    fn in_order_tasks_start_in_index_order() {
        for threads in [1, 2, 3, 4] {
            let pool = ThreadPool::new(threads);
            let n = 64;
            let started = AtomicUsize::new(0);
            let out_of_order = AtomicBool::new(false);
            let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            pool.parallel_for_in_order(n, &|i| {
                // Every task before i has been claimed; all but at most the other
                // threads' current ones have also counted their start.
                if started.fetch_add(1, Ordering::SeqCst) + threads < i + 1 {
                    out_of_order.store(true, Ordering::SeqCst);
                }
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(!out_of_order.load(Ordering::SeqCst), "{threads} threads");
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn workers_wake_after_parking() {
        let pool = ThreadPool::new(3);
        std::thread::sleep(SPIN * 4);
        let sum = AtomicUsize::new(0);
        pool.parallel_for(64, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 64 * 63 / 2);
    }

    #[test]
    fn nested_calls_run_inline() {
        let pool = ThreadPool::new(2);
        let sum = AtomicUsize::new(0);
        pool.parallel_for(4, &|_| {
            pool.parallel_for(3, &|j| {
                sum.fetch_add(j + 1, Ordering::Relaxed);
            });
        });
        assert_eq!(sum.load(Ordering::Relaxed), 4 * 6);
    }

    #[test]
    fn chunks_are_disjoint_and_cover_the_slice() {
        let pool = ThreadPool::new(3);
        for (len, chunk) in [(0usize, 4usize), (1, 4), (17, 4), (64, 16), (100, 7)] {
            let mut v = vec![0usize; len];
            pool.for_each_chunk_mut(&mut v, chunk, &|i, piece| {
                for (j, x) in piece.iter_mut().enumerate() {
                    *x += i * chunk + j + 1;
                }
            });
            assert_eq!(v, (1..=len).collect::<Vec<_>>(), "len {len} chunk {chunk}");
        }
    }

    #[test]
    fn task_panic_is_reraised_and_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.parallel_for(8, &|i| {
                if i == 5 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let n = AtomicUsize::new(0);
        pool.parallel_for(8, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 8);
    }
}
