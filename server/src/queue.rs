//! A bounded first-come-first-served queue in front of scarce work (the one generation
//! session; the embedder). Requests beyond `slots + waiting` are refused at once (HTTP
//! 429) instead of piling up; the rest run in arrival order (tokio's semaphore is FIFO).
//! A request whose client leaves while it waits drops its place.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug)]
pub struct FairQueue {
    slots: Arc<Semaphore>,
    slot_count: usize,
    /// Admitted requests: running plus waiting.
    admitted: Arc<AtomicUsize>,
    limit: usize,
}

/// The queue is full: the caller answers 429.
#[derive(Debug, PartialEq, Eq)]
pub struct QueueFull;

/// A place in the queue; dropping it leaves the queue.
#[derive(Debug)]
struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The right to run; held until the work ends (moved into the blocking job).
#[derive(Debug)]
pub struct Ticket {
    _permit: OwnedSemaphorePermit,
    _place: Place,
}

/// How full a queue is, for `/health`.
#[derive(Debug, Clone, Copy, serde::Serialize, PartialEq, Eq)]
pub struct QueueState {
    pub running: usize,
    pub waiting: usize,
    pub capacity: usize,
}

impl FairQueue {
    /// `slots` run at once; up to `waiting` more wait for a slot.
    pub fn new(slots: usize, waiting: usize) -> Self {
        let slots = slots.max(1);
        FairQueue {
            slots: Arc::new(Semaphore::new(slots)),
            slot_count: slots,
            admitted: Arc::new(AtomicUsize::new(0)),
            limit: slots + waiting,
        }
    }

    /// Take a place (or fail at once if the queue is full), then wait for a slot.
    pub async fn enter(&self) -> Result<Ticket, QueueFull> {
        let admitted = self
            .admitted
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.limit).then_some(n + 1)
            });
        if admitted.is_err() {
            return Err(QueueFull);
        }
        let place = Place(Arc::clone(&self.admitted));
        let permit = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(|_| QueueFull)?;
        Ok(Ticket {
            _permit: permit,
            _place: place,
        })
    }

    pub fn state(&self) -> QueueState {
        let admitted = self.admitted.load(Ordering::SeqCst);
        let running = self.slot_count - self.slots.available_permits();
        QueueState {
            running,
            waiting: admitted.saturating_sub(running),
            capacity: self.limit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn admits_in_order_and_refuses_beyond_capacity() {
        let q = Arc::new(FairQueue::new(1, 2));
        let first = q.enter().await.unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..2 {
            let (q2, order) = (Arc::clone(&q), Arc::clone(&order));
            waiters.push(tokio::spawn(async move {
                let t = q2.enter().await.unwrap();
                order.lock().unwrap().push(i);
                drop(t);
            }));
            // Let each waiter take its place before the next arrives.
            while q.state().waiting < i + 1 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        assert_eq!(
            q.state(),
            QueueState {
                running: 1,
                waiting: 2,
                capacity: 3
            }
        );
        assert_eq!(q.enter().await.unwrap_err(), QueueFull);
        drop(first);
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1]);
        assert_eq!(q.state().running + q.state().waiting, 0);
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_frees_its_place() {
        let q = FairQueue::new(1, 1);
        let _running = q.enter().await.unwrap();
        let gave_up = tokio::time::timeout(Duration::from_millis(20), q.enter()).await;
        assert!(gave_up.is_err(), "no slot was free");
        assert_eq!(q.state().waiting, 0);
        // Its place is free again: one more may wait.
        let again = tokio::time::timeout(Duration::from_millis(20), q.enter()).await;
        assert!(again.is_err());
    }
}
