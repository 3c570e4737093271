//! What several test files share.

/// Whether `program` (needed by the calling test only, not by flowlane) can run. Where it
/// cannot, says so with the package to install; with `CI` set that is a failure, not a skip,
/// so CI keeps proving what the test checks.
pub fn need_program(program: &str) -> bool {
    if flowlane_lab::have_program(program) {
        return true;
    }
    let hint = flowlane_lab::missing_hint(program);
    assert!(
        std::env::var_os("CI").is_none(),
        "{hint}: CI installs it, and this test must run there"
    );
    eprintln!("SKIP: {hint}; this test needs it");
    false
}
