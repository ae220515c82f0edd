//! The compile errors of `#[cached]`, pinned: each `tests/ui/*.rs` is one misuse, next to the
//! `.stderr` the compiler prints for it; `tests/ui/pass/*.rs` are shapes that must compile.
//!
//! The expected output is rustc's: after a toolchain upgrade changes its wording, review the
//! difference and refresh the files with `TRYBUILD=overwrite cargo test -p stampede-ui-tests`.

#[test]
fn compile_errors_and_accepted_shapes() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("*.rs");
    cases.pass("pass/*.rs");
}
