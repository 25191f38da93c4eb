//! What the async model tests share beyond the test kit: a tokio task ended while it waits.
// Test code; each test binary uses what it needs.
#![allow(dead_code, unreachable_pub)]

use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

/// A current-thread tokio runtime with timers.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// Whether tokio's timeout of 5 ms, around `fut` on `rt`, fired (dropping `fut`).
pub fn tokio_timeout_fires(rt: &tokio::runtime::Runtime, fut: impl Future) -> bool {
    rt.block_on(async { tokio::time::timeout(Duration::from_millis(5), fut).await })
        .is_err()
}

/// Spawns `wait(started)` on a current-thread tokio runtime and runs it until it has set
/// `started` and taken three more turns (so it is waiting), runs `while_waiting`, then ends
/// the task while it waits: by aborting it (`shutdown` false), or by dropping the runtime
/// with it (`shutdown` true).
pub fn end_a_waiting_task<F: Future<Output = ()> + 'static>(
    shutdown: bool,
    wait: impl FnOnce(Rc<Cell<bool>>) -> F,
    while_waiting: impl FnOnce(),
) {
    let rt = runtime();
    let local = tokio::task::LocalSet::new();
    let started = Rc::new(Cell::new(false));
    let task = local.spawn_local(wait(started.clone()));
    rt.block_on(local.run_until(async {
        while !started.get() {
            tokio::task::yield_now().await;
        }
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
    }));
    while_waiting();
    if shutdown {
        // The runtime (and its tasks) go with operations in flight.
        drop(local);
        drop(rt);
        drop(task);
    } else {
        task.abort();
        rt.block_on(local.run_until(async {
            assert!(task.await.unwrap_err().is_cancelled());
        }));
    }
}
