//! The output folders a run makes, and taking them back when it leaves
//! nothing in them: a convert refused before it wrote (DST holds someone's
//! weights, too little space) leaves no empty DST behind. Only the folders
//! this run created are removed, deepest first, and each only while empty
//! (`remove_dir`, which also never removes a symlink); a folder that
//! existed before, or that another process created at the same moment, is
//! never removed.

use std::io;
use std::path::{Path, PathBuf};

/// The folders [`MadeDirs::create`] made; removed again on drop unless
/// [`MadeDirs::keep`] was called.
#[derive(Debug)]
pub struct MadeDirs {
    /// Outermost first.
    made: Vec<PathBuf>,
}

impl MadeDirs {
    /// Creates `dir` and every missing folder above it (as
    /// `create_dir_all` does), remembering which ones this call made.
    pub fn create(dir: &Path) -> io::Result<MadeDirs> {
        if let Some(e) = blocked(dir) {
            return Err(e);
        }
        let missing: Vec<&Path> = dir
            .ancestors()
            .take_while(|d| !d.as_os_str().is_empty() && std::fs::symlink_metadata(d).is_err())
            .collect();
        let mut made = MadeDirs { made: Vec::new() };
        for d in missing.into_iter().rev() {
            match std::fs::create_dir(d) {
                Ok(()) => made.made.push(d.to_path_buf()),
                // Another process made it (or a link now stands there):
                // not ours to remove; create_dir_all below says if it is
                // usable.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                // A folder above went away (another run took back the one
                // it made): create_dir_all below makes them all again,
                // unrecorded, so they are kept.
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(e) => return Err(e),
            }
        }
        // What existed already must be a folder (or lead to one).
        std::fs::create_dir_all(dir)?;
        Ok(made)
    }

    /// The run left output: its folders stay.
    pub fn keep(mut self) {
        self.made.clear();
    }
}

/// Why `dir` cannot be a folder, said plainly (the OS says only "File
/// exists"): the nearest path on its way that exists is a file, or a
/// symlink to nothing. `None` when nothing is in the way.
pub fn blocked(dir: &Path) -> Option<io::Error> {
    // `afile/` and `afile/.` name `afile` (the OS then says only "File
    // exists" or "Not a directory").
    let dir: PathBuf = dir.components().collect();
    let dir = dir.as_path();
    let existing = dir
        .ancestors()
        .filter(|d| !d.as_os_str().is_empty())
        .find(|d| std::fs::symlink_metadata(d).is_ok())?;
    let what = if existing == dir {
        "DST"
    } else {
        "a folder above DST"
    };
    let reason = match std::fs::metadata(existing) {
        Ok(m) if m.is_dir() => return None,
        Ok(_) => format!(
            "{} ({what}) is a file, not a folder; a DST that does not end in .safetensors \
             or .gguf names a folder: name another path",
            existing.display()
        ),
        Err(_) => format!(
            "{} ({what}) is a symlink to {}, which does not exist; reshard does not make the \
             folder a link points to: make it, or name another path",
            existing.display(),
            std::fs::read_link(existing)
                .map(|t| t.display().to_string())
                .unwrap_or_else(|_| "nothing".into())
        ),
    };
    Some(io::Error::new(io::ErrorKind::AlreadyExists, reason))
}

impl Drop for MadeDirs {
    fn drop(&mut self) {
        for d in self.made.iter().rev() {
            // Not empty (the run wrote, someone else did): it stays, and
            // so does every folder above it.
            if std::fs::remove_dir(d).is_err() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_or_a_dangling_link_on_the_way_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("afile");
        std::fs::write(&file, b"x").unwrap();
        for dst in [
            file.clone(),
            file.join("sub"),
            tmp.path().join("afile/"),
            file.join("."),
        ] {
            let err = MadeDirs::create(&dst).unwrap_err().to_string();
            assert!(
                err.contains("afile") && err.contains("is a file, not a folder"),
                "{err}"
            );
        }
        #[cfg(unix)]
        {
            let link = tmp.path().join("dangling");
            std::os::unix::fs::symlink(tmp.path().join("nowhere"), &link).unwrap();
            let err = MadeDirs::create(&link.join("out")).unwrap_err().to_string();
            assert!(
                err.contains("which does not exist") && err.contains("nowhere"),
                "{err}"
            );
            assert!(!tmp.path().join("nowhere").exists());
        }
        assert_eq!(std::fs::read(&file).unwrap(), b"x");
    }

    #[test]
    fn only_the_empty_folders_a_run_made_are_taken_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("a/b/c");
        drop(MadeDirs::create(&dst).unwrap());
        assert!(
            !tmp.path().join("a").exists(),
            "all three were made and empty"
        );
        assert!(tmp.path().exists());

        // A folder that held a file stays, and so do the folders above it.
        let made = MadeDirs::create(&dst).unwrap();
        assert_eq!(made.made.len(), 3);
        std::fs::write(tmp.path().join("a/b/theirs"), "x").unwrap();
        drop(made);
        assert!(!dst.exists());
        assert!(tmp.path().join("a/b/theirs").exists());

        // A folder that existed before is never removed.
        std::fs::create_dir(&dst).unwrap();
        let made = MadeDirs::create(&dst).unwrap();
        assert!(made.made.is_empty());
        drop(made);
        assert!(dst.exists());

        let kept = tmp.path().join("kept/out");
        MadeDirs::create(&kept).unwrap().keep();
        assert!(kept.is_dir());
    }
}
