//! The README's ping-pong and multicast feed are the doctests CI compiles, unchanged: the
//! code a reader copies from the README is code that builds.

/// The lines a reader sees of the first ```no_run doctest after `marker` in a `//!` doc.
fn doctest_after(doc: &str, marker: &str) -> Vec<String> {
    let from = doc.find(marker).expect("the doc has the marker");
    let mut out = Vec::new();
    let mut inside = false;
    for line in doc[from..].lines().skip(1) {
        let Some(text) = line.trim_start().strip_prefix("//!") else {
            break;
        };
        let text = text.strip_prefix(' ').unwrap_or(text);
        if !inside {
            inside = text.starts_with("```no_run");
            continue;
        }
        if text.starts_with("```") {
            return out;
        }
        if text != "#" && !text.starts_with("# ") {
            out.push(text.to_owned());
        }
    }
    panic!("no closed doctest after {marker:?}");
}

/// The lines of the ```rust,no_run block after `marker` in the README.
fn readme_block_after(readme: &str, marker: &str) -> Vec<String> {
    let from = readme.find(marker).expect("the README has the marker");
    let rest = &readme[from..];
    let start = rest.find("```rust,no_run\n").expect("a rust block") + "```rust,no_run\n".len();
    let end = rest[start..].find("\n```").expect("a closed block");
    rest[start..start + end]
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_readme_shows_the_ping_pong_and_the_multicast_feed_the_doctests_compile() {
    let readme = include_str!("../../README.md");
    let ping = doctest_after(include_str!("../src/lib.rs"), "A two-process");
    assert!(ping.len() > 10 && ping.len() <= 25, "{} lines", ping.len());
    assert_eq!(
        readme_block_after(readme, "A two-process RC ping-pong"),
        ping
    );
    let feed = doctest_after(
        include_str!("../../core/src/datagram/mod.rs"),
        "A multicast feed on a device",
    );
    assert_eq!(readme_block_after(readme, "A multicast feed ("), feed);
}
