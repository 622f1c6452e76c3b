//! Glob sets over tensor names (`--keep-dtype`, `--keep`,
//! `--quantize-only`): `*` crosses dots, as users write `*.mlp.*`.

/// The set of `globs`, or the glob (all of them, for a set that fails as a
/// whole) that does not parse and why.
pub fn glob_set(globs: &[String]) -> Result<globset::GlobSet, (String, globset::Error)> {
    let mut set = globset::GlobSetBuilder::new();
    for g in globs {
        let glob = globset::GlobBuilder::new(g)
            .literal_separator(false)
            .build()
            .map_err(|e| (g.clone(), e))?;
        set.add(glob);
    }
    set.build().map_err(|e| (globs.join(" "), e))
}
