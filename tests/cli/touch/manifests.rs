//! A planted `reshard.json` of many tiny entries is refused at the caps
//! real outputs stay under (100,000 files, 262,144 tensors), exit 2, by
//! validate and by a rerun, instead of being parsed into gigabytes.

use crate::common::*;

#[test]
fn a_manifest_past_the_file_cap_is_refused_by_validate_and_by_a_rerun() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    let src = fixture("tiny-llama");
    convert(&src, &dst, &[]).success();
    let path = dst.join("reshard.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    manifest["copied_files"] = serde_json::json!(vec!["a"; 100_001]);
    std::fs::write(&path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let before = std::fs::read(dst.join("model.safetensors")).unwrap();
    let validate = reshard().arg("validate").arg(&dst).assert().code(2);
    let rerun = convert(&src, &dst, &[]).code(2);
    for out in [validate, rerun] {
        let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
        assert!(err.contains("reshard.json"), "{err}");
        assert!(err.contains("more than 100000 entries"), "{err}");
    }
    assert_eq!(
        std::fs::read(dst.join("model.safetensors")).unwrap(),
        before
    );
}
