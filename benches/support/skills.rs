//! The generated skill the gateway benchmarks serve: a declaration with
//! one granted env variable, a script and a few reference files.

use std::path::{Path, PathBuf};

/// One skill directory `<root>/<name>`; `bench` names the benchmark in its description.
pub(crate) fn skill(root: &Path, name: &str, bench: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    std::fs::create_dir_all(dir.join("references")).unwrap();
    std::fs::write(
        dir.join("SKILL.md"),
        format!("---\nname: {name}\ndescription: Generated skill {name} for the {bench} benchmark.\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/run.py\n      interpreter: python\n      env: [API_KEY]\n---\n# {name}\n\nRun scripts/run.py.\n"),
    )
    .unwrap();
    std::fs::write(dir.join("scripts/run.py"), "print('hi')\n").unwrap();
    for i in 0..8 {
        std::fs::write(dir.join(format!("references/ref-{i}.md")), "# Ref\n".repeat(40)).unwrap();
    }
    dir
}
