//! Tests between processes: the peer is a child process, this same test binary running one
//! of its ignored entry points. A world of ranks is started with [`run_children`] (or
//! [`child_command`] where the test steers the children itself); a single peer driven line
//! by line over its stdin and stdout is a [`Peer`]. The child answers with lines that open
//! with a tag, because libtest prints its own lines on the same stdout (and may open the
//! child's first line with them). Binary values (endpoints, remote memory) travel as hex.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// A command that runs the ignored test `entry` of this test binary, alone and with its
/// output shown; the caller adds the environment that tells the child its part.
pub fn child_command(entry: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("the test binary's own path"));
    c.args([
        "--exact",
        entry,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    c
}

/// The environment variable `name`, which the parent must have set (in a child process).
pub fn required_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

/// The environment variable `name`, which must be a number.
fn env_number(name: &str) -> u32 {
    let v = required_env(name);
    v.parse().unwrap_or_else(|e| panic!("{name}={v}: {e}"))
}

/// An empty directory of its own under the system's temporary directory, for `name` (which
/// should name the test and its port) in this process: where parent and children leave
/// each other marks.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rverbs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

/// Starts rank `rank` of a world of child processes: the ignored `child_rank` entry point,
/// told its rank, the bootstrap port, a scratch directory and the device through
/// `{prefix}RANK`, `{prefix}PORT`, `{prefix}DIR` and `RVERBS_TEST_DEVICE`, and each
/// `(name, value)` of `extra` as `{prefix}{name}`. The child reads them with [`rank_env`].
pub fn spawn_rank(
    prefix: &str,
    rank: u32,
    port: u16,
    dev: &str,
    dir: &Path,
    extra: &[(&str, &str)],
) -> Child {
    let mut c = child_command("child_rank");
    c.env(format!("{prefix}RANK"), rank.to_string())
        .env(format!("{prefix}PORT"), port.to_string())
        .env(format!("{prefix}DIR"), dir)
        .env("RVERBS_TEST_DEVICE", dev);
    for (name, value) in extra {
        c.env(format!("{prefix}{name}"), value);
    }
    c.spawn()
        .unwrap_or_else(|e| panic!("start rank {rank}: {e}"))
}

/// What [`spawn_rank`] told a child rank.
#[derive(Debug)]
pub struct RankEnv {
    /// This child's rank.
    pub rank: u32,
    /// The bootstrap port.
    pub port: u16,
    /// The scratch directory parent and children share.
    pub dir: PathBuf,
    /// The device to run on.
    pub dev: String,
}

/// In a child started by [`spawn_rank`] with `prefix`: what it was told.
pub fn rank_env(prefix: &str) -> RankEnv {
    let number = |name: &str| env_number(&format!("{prefix}{name}"));
    RankEnv {
        rank: number("RANK"),
        port: u16::try_from(number("PORT")).expect("a TCP port"),
        dir: PathBuf::from(required_env(&format!("{prefix}DIR"))),
        dev: required_env("RVERBS_TEST_DEVICE"),
    }
}

/// Runs `world` child processes of `scenario` on `dev`, each running the ignored
/// `child_rank` entry point and told its rank, the world size and the bootstrap port through
/// `{prefix}SCENARIO`, `{prefix}RANK`, `{prefix}WORLD` and `{prefix}PORT`; kills any still
/// running after 600 s. Returns what failed and how long the world took.
pub fn run_children(
    prefix: &str,
    scenario: &str,
    world: u32,
    port: u16,
    dev: &str,
) -> (Vec<String>, Duration) {
    let start = Instant::now();
    let mut kids: Vec<_> = (0..world)
        .map(|r| {
            child_command("child_rank")
                .env(format!("{prefix}SCENARIO"), scenario)
                .env(format!("{prefix}RANK"), r.to_string())
                .env(format!("{prefix}WORLD"), world.to_string())
                .env(format!("{prefix}PORT"), port.to_string())
                .env("RVERBS_TEST_DEVICE", dev)
                .spawn()
                .expect("start a child rank")
        })
        .collect();
    let limit = Duration::from_secs(600);
    let mut failed = Vec::new();
    for (r, k) in kids.iter_mut().enumerate() {
        loop {
            if let Some(st) = k.try_wait().expect("wait for a child rank") {
                if !st.success() {
                    failed.push(format!("rank {r}: {st}"));
                }
                break;
            }
            if start.elapsed() > limit {
                let _ = k.kill();
                failed.push(format!("rank {r}: killed after {limit:?}"));
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    (failed, start.elapsed())
}

/// In a child started by [`run_children`] with `prefix`: what it was told, as
/// `(scenario, rank, world, port, device)`.
pub fn world_env(prefix: &str) -> (String, u32, u32, u16, String) {
    let number = |name: &str| env_number(&format!("{prefix}{name}"));
    (
        required_env(&format!("{prefix}SCENARIO")),
        number("RANK"),
        number("WORLD"),
        u16::try_from(number("PORT")).expect("a TCP port"),
        required_env("RVERBS_TEST_DEVICE"),
    )
}

/// A child process and the parent's ends of its pipes.
#[derive(Debug)]
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
        let mut child = child_command(entry)
            .envs(env.iter().copied())
            .env("RVERBS_TEST_DEVICE", dev)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let to = child.stdin.take().expect("piped stdin");
        let from = BufReader::new(child.stdout.take().expect("piped stdout"));
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
        writeln!(self.to, "{line}").unwrap_or_else(|e| panic!("{}: {e}", self.name));
        self.to
            .flush()
            .unwrap_or_else(|e| panic!("{}: {e}", self.name));
    }

    /// The next protocol line, which must be `what`; its argument.
    pub fn line(&mut self, what: &str) -> String {
        let mut l = String::new();
        loop {
            l.clear();
            let n = self
                .from
                .read_line(&mut l)
                .unwrap_or_else(|e| panic!("{}: {e}", self.name));
            assert!(n > 0, "{} ended before sending `{what}`", self.name);
            if let Some((_, rest)) = l.trim_end().split_once(self.tag) {
                let (w, arg) = rest.split_once(' ').unwrap_or((rest, ""));
                assert_eq!(w, what, "{}: {l}", self.name);
                return arg.to_owned();
            }
        }
    }

    /// Waits for the child to end, which it must do successfully.
    pub fn wait(mut self) {
        let status = self
            .child
            .wait()
            .unwrap_or_else(|e| panic!("{}: {e}", self.name));
        assert!(status.success(), "{} failed: {status}", self.name);
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
    std::io::stdout().flush().expect("write to the parent");
}

/// `b` as lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of the hex string `s` (which the parent or child wrote with [`hex`]).
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digits"))
        .collect()
}
