//! Every descendant of a child, on Linux, even one that left the child's
//! process group and session (`setsid`): reshard is made a child
//! subreaper (`PR_SET_CHILD_SUBREAPER`), so a process whose parent dies is
//! re-parented to reshard rather than to init, and each tree's processes
//! carry a mark in their environment ([`MARK_ENV`]) that tells them from
//! the trees of reshard's other children. [`kill`] walks `/proc` for
//! reshard's descendants under a marked child, kills them until none is
//! left, and reaps the orphans it was handed (never the tree's leader,
//! which std's `Child` reaps).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The environment variable that names a child's tree.
pub const MARK_ENV: &str = "RESHARD_PROCESS_TREE";
/// Rounds of scan-and-kill before giving up on a process that will not
/// die (one stuck in the kernel): about 2 s.
const ROUNDS: usize = 400;
const ROUND_PAUSE: Duration = Duration::from_millis(5);
/// Most of a process's environment read when looking for the mark.
const MAX_ENVIRON: u64 = 4 << 20;

/// A mark no other tree of this process has, after making this process a
/// subreaper (once; it holds for its life).
pub fn new_mark() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static SUBREAPER: std::sync::Once = std::sync::Once::new();
    SUBREAPER.call_once(|| {
        // SAFETY: prctl with integer arguments only; it changes how this
        // process's orphaned descendants are re-parented, nothing else. A
        // failure (an old kernel) leaves the group kill as the only reach.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{}-{n}", std::process::id())
}

#[derive(Debug, Clone, Copy)]
struct Proc {
    ppid: libc::pid_t,
    zombie: bool,
}

/// Every process `/proc` shows, with its parent and whether it is a zombie.
fn scan() -> BTreeMap<libc::pid_t, Proc> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some(p) = parse_stat(&stat) {
            out.insert(pid, p);
        }
    }
    out
}

/// "PID (comm) STATE PPID ...": the state and parent follow the last ')',
/// since `comm` may hold anything.
fn parse_stat(stat: &str) -> Option<Proc> {
    let mut rest = stat.rsplit_once(')')?.1.split_ascii_whitespace();
    let state = rest.next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some(Proc {
        ppid,
        zombie: state == "Z" || state == "X",
    })
}

/// Whether process `pid` started with `MARK_ENV=mark` in its environment
/// (what it had at exec; later changes to its own copy do not hide it).
fn carries(pid: libc::pid_t, mark: &str) -> bool {
    let Ok(f) = std::fs::File::open(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let mut env = Vec::new();
    if f.take(MAX_ENVIRON).read_to_end(&mut env).is_err() {
        return false;
    }
    let want = format!("{MARK_ENV}={mark}");
    env.split(|&b| b == 0).any(|v| v == want.as_bytes())
}

/// This process's descendants under its marked children (and the marked
/// orphans it adopted), by pid.
fn tree(procs: &BTreeMap<libc::pid_t, Proc>, me: libc::pid_t, mark: &str) -> Vec<libc::pid_t> {
    let mut children: BTreeMap<libc::pid_t, Vec<libc::pid_t>> = BTreeMap::new();
    for (&pid, p) in procs {
        children.entry(p.ppid).or_default().push(pid);
    }
    let mut stack: Vec<libc::pid_t> = children
        .get(&me)
        .into_iter()
        .flatten()
        .copied()
        .filter(|&pid| carries(pid, mark))
        .collect();
    let mut out = Vec::new();
    while let Some(pid) = stack.pop() {
        out.push(pid);
        stack.extend(children.get(&pid).into_iter().flatten());
    }
    out
}

/// Kills every process of the tree marked `mark` until none runs, and
/// reaps the ones that were re-parented to this process. `leader` (the
/// child std spawned) is killed but left to its `Child` to reap.
pub fn kill(mark: &str, leader: libc::pid_t) -> io::Result<()> {
    // SAFETY: getpid takes nothing and cannot fail.
    let me = unsafe { libc::getpid() };
    let mut killed: BTreeSet<libc::pid_t> = BTreeSet::new();
    for _ in 0..ROUNDS {
        let procs = scan();
        let mut live = false;
        for pid in tree(&procs, me, mark) {
            if !procs[&pid].zombie {
                // SAFETY: kill takes plain integers; the pid is a
                // descendant of ours, so not yet reaped and not reused.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                killed.insert(pid);
                live = true;
            }
        }
        // A killed orphan is ours to reap (its environment is gone once it
        // is a zombie, so it is known from the set, not by its mark).
        let mut unreaped = false;
        for &pid in &killed {
            let ours = procs.get(&pid).is_some_and(|p| p.ppid == me);
            if pid != leader && ours {
                let mut status = 0;
                // SAFETY: a pid that is our own child; WNOHANG never blocks.
                let got = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                unreaped |= got == 0;
            }
        }
        if !live && !unreaped {
            return Ok(());
        }
        std::thread::sleep(ROUND_PAUSE);
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        "a process of the tree would not end",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_after_the_last_parenthesis() {
        let p = parse_stat("42 (a) b) (c) S 7 42 42 0").unwrap();
        assert_eq!(p.ppid, 7);
        assert!(!p.zombie);
        assert!(parse_stat("9 (x) Z 1 0").unwrap().zombie);
        assert!(parse_stat("garbage").is_none());
    }
}
