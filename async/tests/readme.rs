//! The workspace README's async section shows this crate's README code unchanged: the
//! crate README's code blocks are doctests (`cargo test -p rverbs-async --doc`), so the
//! code a reader of either README sees is code that compiles.

/// The ```rust blocks of `text`, fences included.
fn rust_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut cur: Option<String> = None;
    for line in text.lines() {
        match cur.as_mut() {
            None if line.starts_with("```rust") => cur = Some(format!("{line}\n")),
            None => {}
            Some(b) => {
                b.push_str(line);
                b.push('\n');
                if line == "```" {
                    blocks.extend(cur.take());
                }
            }
        }
    }
    assert!(cur.is_none(), "an unclosed code block");
    blocks
}

#[test]
fn the_workspace_readme_shows_the_crate_readme_code_unchanged() {
    let workspace = include_str!("../../README.md");
    let start = workspace
        .find("## async/await (rverbs-async)")
        .expect("the workspace README has its async section");
    let section = &workspace[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |e| e + 3);
    let shown = rust_blocks(&section[..end]);
    let compiled = rust_blocks(include_str!("../README.md"));
    assert!(!shown.is_empty(), "the async section shows no code");
    assert_eq!(
        shown, compiled,
        "the workspace README's async code differs from async/README.md's (the doctest)"
    );
}
