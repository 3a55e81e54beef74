//! Prints the 256-code table of fp8 e4m3b15 as Markdown, from the host reference.
//!
//! `cargo run -p oxccl-kernels --example e4m3b15_table` (its output is the table at the end
//! of docs/number-formats.md; a unit test checks that the two agree).

fn main() {
    print!("{}", oxccl_kernels::formats::e4m3b15::markdown_table());
}
