//! Tests between processes: the peer is a child process, this same test binary running one
//! of its ignored entry points, driven over its stdin and stdout. The parent writes one
//! command per line; the child answers with lines that open with a tag, because libtest
//! prints its own lines on the same stdout (and may open the child's first line with them).
//! Binary values (endpoints, remote memory) travel as hex.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// A child process and the parent's ends of its pipes.
pub struct Peer {
    child: Child,
    to: ChildStdin,
    from: BufReader<ChildStdout>,
    /// What failures call it.
    pub name: String,
    /// What the child's protocol lines open with.
    tag: &'static str,
}

impl Peer {
    /// Starts the ignored test `entry` of this binary on device `dev`, with `env` set besides;
    /// its protocol lines open with `tag`, and failures call it `name`.
    pub fn start(
        entry: &str,
        tag: &'static str,
        name: &str,
        dev: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                entry,
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .envs(env.iter().copied())
            .env("RVERBS_TEST_DEVICE", dev)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let to = child.stdin.take().unwrap();
        let from = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            to,
            from,
            name: name.to_owned(),
            tag,
        }
    }

    /// Sends the child one command line.
    pub fn say(&mut self, line: &str) {
        writeln!(self.to, "{line}").unwrap();
        self.to.flush().unwrap();
    }

    /// The next protocol line, which must be `what`; its argument.
    pub fn line(&mut self, what: &str) -> String {
        let mut l = String::new();
        loop {
            l.clear();
            assert!(
                self.from.read_line(&mut l).unwrap() > 0,
                "{} ended before sending `{what}`",
                self.name
            );
            if let Some((_, rest)) = l.trim_end().split_once(self.tag) {
                let (w, arg) = rest.split_once(' ').unwrap_or((rest, ""));
                assert_eq!(w, what, "{}: {l}", self.name);
                return arg.to_owned();
            }
        }
    }

    /// Waits for the child to end, which it must do successfully.
    pub fn wait(mut self) {
        assert!(self.child.wait().unwrap().success(), "{} failed", self.name);
    }

    /// Tells the child `quit` and waits for it to end successfully.
    pub fn finish(mut self) {
        self.say("quit");
        self.wait();
    }
}

/// In the child: writes one protocol line, opened with `tag`, to the parent.
pub fn say(tag: &str, line: &str) {
    println!("{tag}{line}");
    std::io::stdout().flush().unwrap();
}

/// `b` as lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of the hex string `s`.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}
