//! `memory::release_startup_code` in a real process: this test binary's own
//! mappings, read from /proc before and after, and code run afterwards.
//! One test only, so no other test thread faults pages in between.

use std::os::unix::fs::MetadataExt;

/// (range, writable, Rss kB, Anonymous kB) of this executable's mappings.
fn own_mappings() -> Vec<(String, bool, u64, u64)> {
    let exe = std::fs::metadata("/proc/self/exe").unwrap();
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut out: Vec<(String, bool, u64, u64)> = Vec::new();
    let mut ours = false;
    for line in smaps.lines() {
        let parts: Vec<&str> = line.split_ascii_whitespace().collect();
        if parts.len() >= 5 && parts[0].contains('-') && parts[1].len() == 4 {
            ours = parts[4].parse::<u64>().ok() == Some(exe.ino());
            if ours {
                out.push((parts[0].to_string(), parts[1].as_bytes()[1] == b'w', 0, 0));
            }
            continue;
        }
        let kib = |name: &str| line.strip_prefix(name).and_then(|v| v.trim().strip_suffix("kB")).and_then(|v| v.trim().parse::<u64>().ok());
        if let (true, Some(last)) = (ours, out.last_mut()) {
            if let Some(v) = kib("Rss:") {
                last.2 = v;
            } else if let Some(v) = kib("Anonymous:") {
                last.3 = v;
            }
        }
    }
    out
}

/// Every page of the executable's clean mappings made resident, as a long
/// start-up would leave them.
fn touch_every_page() {
    for (range, writable, _, anon) in own_mappings() {
        if writable || anon > 0 {
            continue;
        }
        let (start, end) = range.split_once('-').unwrap();
        let (start, end) = (usize::from_str_radix(start, 16).unwrap(), usize::from_str_radix(end, 16).unwrap());
        for page in (start..end).step_by(4096) {
            // SAFETY: a readable mapping of this process's executable, read a byte a page.
            unsafe { std::ptr::read_volatile(page as *const u8) };
        }
    }
}

#[test]
fn clean_code_mappings_are_released_and_the_process_runs_on() {
    touch_every_page();
    let before = own_mappings();
    let clean_before: u64 = before.iter().filter(|m| !m.1 && m.3 == 0).map(|m| m.2).sum();
    assert!(clean_before > 0, "the test binary's code is resident: {before:?}");
    let relocated: Vec<_> = before.iter().filter(|m| !m.1 && m.3 > 0).cloned().collect();

    let released = skill_operator::memory::release_startup_code().expect("released");
    let after = own_mappings();

    assert!(released.mappings >= 1, "{released:?}");
    assert!(released.resident_bytes >= clean_before * 1024 / 2, "reported {released:?}, {clean_before} kB were resident");
    let clean_after: u64 = after.iter().filter(|m| !m.1 && m.3 == 0).map(|m| m.2).sum();
    assert!(clean_after < clean_before / 4, "clean mappings resident: {clean_before} kB before, {clean_after} kB after");
    // Mappings holding the process's own pages (relocated read-only data)
    // keep them: discarding those would bring back unrelocated bytes.
    for (range, _, rss, anon) in &relocated {
        let now = after.iter().find(|m| &m.0 == range).expect("the mapping is still there");
        assert!(now.3 >= *anon && now.2 >= *anon, "{range}: Rss {rss} / Anonymous {anon} kB before, {now:?} after");
    }

    // Code and read-only data come back from the file: work that goes
    // through vtables, formatting and parsing still gives the right answers.
    let parsed = skill_operator::oci::reference::parse("registry.local:5000/team/skill:v1").expect("parses");
    assert_eq!((parsed.registry(), parsed.repository(), parsed.tag()), ("registry.local:5000", "team/skill", Some("v1")));
    let yaml: serde_json::Value = serde_json::from_str(r#"{"a":[1,2,{"b":"c"}]}"#).unwrap();
    assert_eq!(yaml["a"][2]["b"], "c");
    let again = skill_operator::memory::release_startup_code().expect("a second release works too");
    assert!(again.mappings >= 1);
}
