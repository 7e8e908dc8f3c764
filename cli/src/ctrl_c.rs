//! Ctrl-C for the commands that stream an answer: a thread of its own waits for SIGINT so
//! the answer keeps being written on the main thread.

use anyhow::Result;

/// Runs `on_signal` on every Ctrl-C from now on (replacing the default, which ends the
/// process); the handler decides whether to cancel work or to exit.
pub fn on_ctrl_c(mut on_signal: impl FnMut() + Send + 'static) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::spawn(move || {
        rt.block_on(async move {
            while tokio::signal::ctrl_c().await.is_ok() {
                on_signal();
            }
        })
    });
    Ok(())
}
