//! The device a test runs on.

/// [`test_device`] for the test running on this thread (libtest names each test's thread
/// after it, unless it runs one test at a time on its main thread).
pub fn device() -> Option<String> {
    let thread = std::thread::current();
    let test = match thread.name() {
        Some(name) if name != "main" => name,
        _ => "a device test",
    };
    test_device(test)
}

/// The device named by `RVERBS_TEST_DEVICE`, or `None` (after saying so on stderr, naming
/// `test`) when the test is to be skipped. Under `CI=true` a missing device panics instead:
/// CI must never pass a device test that did not run.
pub fn test_device(test: &str) -> Option<String> {
    match std::env::var("RVERBS_TEST_DEVICE") {
        Ok(d) if !d.is_empty() => Some(d),
        _ => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!(
                    "{test}: RVERBS_TEST_DEVICE is not set and CI=true; device tests must run \
                     on a device in CI (tools/test-all runs them inside the SoftRoCE VM)"
                );
            }
            eprintln!(
                "{test}: SKIPPED: RVERBS_TEST_DEVICE is not set (e.g. RVERBS_TEST_DEVICE=rxe0)"
            );
            None
        }
    }
}
