//! What happens when a file shrinks under one of our shared mappings.
//!
//! Touching a page of a shared mapping past the end of its (now shorter)
//! file raises SIGBUS, which by default kills the process with no word of
//! why. This module owns a small lock-free registry of the live
//! [`super::super::MappedRange`]s (address range, file offset, path) and a
//! SIGBUS handler that, for a fault inside one of them, writes
//! `error: PATH: the file was truncated or changed ...` to stderr and exits
//! with status 2, the status of any other bad input. Every other SIGBUS
//! goes to the handler that was there before (std's stack-overflow check),
//! or to the default action: a real bug still dies by the signal.
//!
//! The handler runs in signal context, so everything it reaches is
//! async-signal-safe: atomic loads, `write(2)`, `sigaction`, `raise` and
//! `_exit`; no allocation, lock or std formatting.

use std::ffi::c_void;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{fence, AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::Once;

/// Live mappings the registry can name: one per worker thread is mapped
/// at a time, and workers are at most a few hundred. A mapping that finds
/// every slot taken still works; its fault is just not explained.
const SLOTS: usize = 512;

/// One registered mapping, written only by the thread that claimed it and
/// read by the handler under a sequence lock: `seq` is odd while the other
/// fields change, so the handler never trusts a half-written slot.
struct Slot {
    claimed: AtomicBool,
    seq: AtomicUsize,
    /// First address of the mapped pages, and how many bytes; 0 is none.
    start: AtomicUsize,
    len: AtomicUsize,
    /// The file offset of `start`.
    file_offset: AtomicUsize,
    /// The path's bytes, owned by the [`MapGuard`] holding the slot.
    path: AtomicUsize,
    path_len: AtomicUsize,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            claimed: AtomicBool::new(false),
            seq: AtomicUsize::new(0),
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            file_offset: AtomicUsize::new(0),
            path: AtomicUsize::new(0),
            path_len: AtomicUsize::new(0),
        }
    }

    /// Sets the fields; only the claiming thread calls it.
    fn publish(&self, start: usize, len: usize, file_offset: usize, path: &[u8]) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.start.store(start, Ordering::Relaxed);
        self.len.store(len, Ordering::Relaxed);
        self.file_offset.store(file_offset, Ordering::Relaxed);
        self.path.store(path.as_ptr() as usize, Ordering::Relaxed);
        self.path_len.store(path.len(), Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }
}

static REGISTRY: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];

/// A registered mapping, found by a fault address.
#[derive(Debug, PartialEq, Eq)]
struct Hit {
    /// The file offset the fault address maps.
    file_byte: u64,
    path: *const u8,
    path_len: usize,
}

/// The registered mapping that holds `addr`, if any. Async-signal-safe:
/// atomic loads only, one pass, no waiting. A slot changing while it is read
/// is skipped: it cannot be the faulting mapping, whose slot stays fixed
/// while its pages are being read.
fn lookup(addr: usize) -> Option<Hit> {
    REGISTRY.iter().find_map(|slot| {
        let seq = slot.seq.load(Ordering::Acquire);
        if seq % 2 == 1 {
            return None;
        }
        let start = slot.start.load(Ordering::Relaxed);
        let len = slot.len.load(Ordering::Relaxed);
        let file_offset = slot.file_offset.load(Ordering::Relaxed);
        let path = slot.path.load(Ordering::Relaxed);
        let path_len = slot.path_len.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if slot.seq.load(Ordering::Relaxed) != seq || len == 0 {
            return None;
        }
        (start..start.saturating_add(len))
            .contains(&addr)
            .then(|| Hit {
                file_byte: (file_offset as u64).saturating_add((addr - start) as u64),
                path: path as *const u8,
                path_len,
            })
    })
}

/// A mapping's place in the registry, held by [`super::super::MappedRange`]
/// and dropped before its pages are unmapped.
pub struct MapGuard {
    slot: Option<&'static Slot>,
    // The bytes the slot points at: they live exactly as long as the slot
    // is published.
    _path: Box<[u8]>,
}

impl MapGuard {
    /// Registers `mapped`, the bytes of a mapping of `path` from
    /// `file_offset`, installing the SIGBUS handler on the first call.
    pub fn register(mapped: &[u8], file_offset: u64, path: &Path) -> MapGuard {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(install_handler);
        let path: Box<[u8]> = path.as_os_str().as_bytes().into();
        // The kernel maps whole pages: a fault reports an address in one,
        // so the registered range is the pages the bytes lie on.
        let page = page_size();
        let first = mapped.as_ptr() as usize;
        let start = first - first % page;
        let end = (first + mapped.len()).div_ceil(page) * page;
        let slot = REGISTRY.iter().find(|s| {
            s.claimed
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        });
        if let Some(slot) = slot {
            let offset = file_offset.saturating_sub((first - start) as u64);
            slot.publish(
                start,
                end - start,
                usize::try_from(offset).unwrap_or(usize::MAX),
                &path,
            );
        }
        MapGuard { slot, _path: path }
    }
}

impl Drop for MapGuard {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            slot.publish(0, 0, 0, &[]);
            slot.claimed.store(false, Ordering::Release);
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf reads a system constant; no memory of ours.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// The SIGBUS action found before ours (std's stack-overflow handler, or
/// the default), to pass other faults on to.
static PREVIOUS_ACTION: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static PREVIOUS_FLAGS: AtomicI32 = AtomicI32::new(0);

fn install_handler() {
    // SAFETY: sigaction reads and writes the two live structs we pass; the
    // handler is an `extern "C"` function of the signature SA_SIGINFO
    // expects. The previous action is stored before ours is installed, so
    // the handler always finds it. A failure leaves the default in place:
    // mappings work, a fault is just not explained.
    unsafe {
        let mut previous: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) != 0 {
            return;
        }
        PREVIOUS_ACTION.store(previous.sa_sigaction, Ordering::Release);
        PREVIOUS_FLAGS.store(previous.sa_flags, Ordering::Release);
        let mut ours: libc::sigaction = std::mem::zeroed();
        ours.sa_sigaction = on_sigbus as *const () as usize;
        // On the alternate stack std sets up for each thread, as std's own
        // handler runs, so a stack overflow (SIGBUS on macOS) still reaches
        // std's report.
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut ours.sa_mask);
        libc::sigaction(libc::SIGBUS, &ours, std::ptr::null_mut());
    }
}

extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo_t. A code
    // of 0 or less means a process sent the signal (kill, raise; Linux's
    // codes, macOS's are above 0x10000 and come with no address): its
    // address field is no fault address.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code > 0 {
        if let Some(hit) = lookup(addr) {
            // SAFETY: the hit is the mapping being read, so its guard, and
            // the path bytes it owns, live until this thread returns from
            // the read, which it never does: `_exit` ends the process.
            unsafe {
                report(&hit);
                libc::_exit(2);
            }
        }
    }
    // SAFETY: the arguments are the kernel's, passed on unchanged.
    unsafe { pass_on(signal, code, info, context) }
}

/// Writes the error for `hit` to stderr.
///
/// # Safety
/// `hit.path` must point at `hit.path_len` live bytes.
unsafe fn report(hit: &Hit) {
    let mut digits = [0u8; 20];
    // SAFETY: the caller's promise.
    let path = unsafe { std::slice::from_raw_parts(hit.path, hit.path_len) };
    for part in [
        b"error: ".as_slice(),
        path,
        b": the file was truncated or changed while it was being read (the read of byte "
            .as_slice(),
        itoa(hit.file_byte, &mut digits),
        b" faulted: the file is shorter now, or its storage failed); nothing was committed, \
and the next run cleans up\n"
            .as_slice(),
    ] {
        write_all(2, part);
    }
}

/// `n` in decimal, written into the end of `buf`.
fn itoa(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// `write(2)` until done, retried on EINTR; other failures give up (there
/// is nowhere left to report them).
fn write_all(fd: libc::c_int, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a live slice of `bytes.len()` bytes.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
        } else if n == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// Hands a SIGBUS that is not ours to the action found before ours, or to
/// the default.
///
/// # Safety
/// The arguments must be the kernel's, in signal context.
unsafe fn pass_on(
    signal: libc::c_int,
    code: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut c_void,
) {
    let previous = PREVIOUS_ACTION.load(Ordering::Acquire);
    // Ignored before us: a sent one stays ignored (a fault cannot be, the
    // kernel kills for it anyway).
    if previous == libc::SIG_IGN && code <= 0 {
        return;
    }
    // SAFETY: `previous` is the handler the kernel would have called, of
    // the signature its flags say; sigaction and raise are
    // async-signal-safe.
    unsafe {
        if previous != libc::SIG_DFL && previous != libc::SIG_IGN {
            if PREVIOUS_FLAGS.load(Ordering::Acquire) & libc::SA_SIGINFO != 0 {
                let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                    std::mem::transmute(previous);
                handler(signal, info, context);
            } else {
                let handler: extern "C" fn(libc::c_int) = std::mem::transmute(previous);
                handler(signal);
            }
            // std's handler, for a fault that is no stack overflow, puts the
            // default back and returns, counting on the instruction to
            // fault again; a signal sent by a process would then be lost.
            let mut now: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut now) != 0
                || now.sa_sigaction != libc::SIG_DFL
            {
                return;
            }
        } else {
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut default.sa_mask);
            libc::sigaction(signal, &default, std::ptr::null_mut());
        }
        // Blocked while this handler runs: delivered, with the default
        // action, as it returns.
        libc::raise(signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::MappedRange;
    use std::fs::File;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;
    use std::sync::Mutex;

    /// Tests that count on the registry's free slots run one at a time.
    static REGISTRY_TESTS: Mutex<()> = Mutex::new(());

    /// The environment variable that makes a child test run.
    const CHILD: &str = "RESHARD_SIGBUS_CHILD";

    fn file_of_pages(path: &Path, pages: usize) -> File {
        std::fs::write(path, vec![7u8; pages * page_size()]).unwrap();
        File::open(path).unwrap()
    }

    fn found_path(hit: &Hit) -> &[u8] {
        // SAFETY: the test holds the mapping the hit names.
        unsafe { std::slice::from_raw_parts(hit.path, hit.path_len) }
    }

    #[test]
    fn the_registry_names_a_live_mapping_and_forgets_it_when_dropped() {
        let _serial = REGISTRY_TESTS.lock().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let file = file_of_pages(&path, 4);
        let page = page_size();
        // From the middle of a page: the fault's file offset is still exact.
        let offset = page as u64 + 100;
        let map = MappedRange::map(&file, &path, offset, 2 * page).unwrap();
        let addr = map.as_ptr() as usize + 5000;
        let hit = lookup(addr).expect("a live mapping is registered");
        assert_eq!(hit.file_byte, offset + 5000);
        assert_eq!(found_path(&hit), path.as_os_str().as_bytes());
        let (first, last) = (map.as_ptr() as usize, map.as_ptr() as usize + map.len() - 1);
        assert_eq!(lookup(first).unwrap().file_byte, offset);
        assert_eq!(
            lookup(last).unwrap().file_byte,
            offset + 2 * page as u64 - 1
        );
        drop(map);
        // Another test's mapping may have taken the address since; ours is
        // gone either way.
        if let Some(hit) = lookup(addr) {
            assert_ne!(found_path(&hit), path.as_os_str().as_bytes());
        }
    }

    #[test]
    fn a_mapping_past_a_full_registry_still_reads() {
        let _serial = REGISTRY_TESTS.lock().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        let file = file_of_pages(&path, 1);
        let maps: Vec<MappedRange> = (0..SLOTS + 8)
            .map(|_| MappedRange::map(&file, &path, 0, 10).unwrap())
            .collect();
        assert!(maps.iter().all(|m| **m == [7u8; 10]));
        let last = maps.last().unwrap();
        assert_eq!(lookup(last.as_ptr() as usize), None);
        drop(maps);
        // Every slot was given back: a new mapping is named again.
        let map = MappedRange::map(&file, &path, 0, 10).unwrap();
        assert!(lookup(map.as_ptr() as usize).is_some());
    }

    #[test]
    fn numbers_are_written_in_decimal() {
        let mut buf = [0u8; 20];
        assert_eq!(itoa(0, &mut buf), b"0");
        assert_eq!(itoa(4096, &mut buf), b"4096");
        assert_eq!(itoa(u64::MAX, &mut buf), b"18446744073709551615");
    }

    /// Runs the child test `name` of this module in a new process of this
    /// test binary, with `CHILD` set to `arg`.
    fn run_child(name: &str, arg: &Path) -> std::process::Output {
        let module = module_path!().split_once("::").unwrap().1;
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &format!("{module}::{name}")])
            .args(["--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD, arg)
            .output()
            .unwrap()
    }

    /// A child about to die by a signal leaves no core file behind.
    fn no_core_dump() {
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `none` is a live struct; lowering a limit needs no right.
        unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) };
        #[cfg(target_os = "linux")]
        // SAFETY: prctl with plain integers; a pipe core pattern ignores
        // RLIMIT_CORE, but not this.
        unsafe {
            libc::prctl(libc::PR_SET_DUMPABLE, 0);
        }
    }

    #[test]
    #[ignore = "a child of a_truncated_mapping_exits_with_status_2_naming_the_file"]
    fn child_reads_a_truncated_mapping() {
        let Some(path) = std::env::var_os(CHILD) else {
            return;
        };
        no_core_dump();
        let path = Path::new(&path);
        let file = file_of_pages(path, 4);
        let map = MappedRange::map(&file, path, 0, 4 * page_size()).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(0)
            .unwrap();
        // SAFETY: none: this read faults, which is what the parent tests.
        let byte = unsafe { std::ptr::read_volatile(&map[2 * page_size()]) };
        println!("read {byte} past the end of a truncated file");
    }

    #[test]
    fn a_truncated_mapping_exits_with_status_2_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model-00001-of-00002.safetensors");
        let out = run_child("child_reads_a_truncated_mapping", &path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{:?}: {stderr}", out.status);
        let page = page_size() as u64;
        let expected = format!(
            "error: {}: the file was truncated or changed while it was being read (the read of byte {} faulted: the file is shorter now",
            path.display(),
            2 * page
        );
        assert!(stderr.contains(&expected), "{stderr}");
    }

    #[test]
    #[ignore = "a child of a_sigbus_outside_any_mapping_still_kills_by_the_signal"]
    fn child_raises_sigbus() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        no_core_dump();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        let file = file_of_pages(&path, 1);
        // Installs the handler, and keeps a registered mapping live.
        let map = MappedRange::map(&file, &path, 0, 10).unwrap();
        // SAFETY: raise takes a plain integer; dying of it is the test.
        unsafe { libc::raise(libc::SIGBUS) };
        println!("survived SIGBUS with {} bytes mapped", map.len());
    }

    #[test]
    fn a_sigbus_outside_any_mapping_still_kills_by_the_signal() {
        let out = run_child("child_raises_sigbus", Path::new("1"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGBUS),
            "{:?}: {stderr}",
            out.status
        );
        assert!(!stderr.contains("truncated"), "{stderr}");
    }
}
